"""The NCCL transport: the env a rank gets, the parser on saved logs, the verdicts."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucheck.comm.nccl_log import (
    nccl_debug_env,
    nccl_logging,
    parse_nccl_log,
    rank_entry,
    transport_view,
)
from gpucheck.comm.records import TransportEntry
from gpucheck.comm.report import Verdicts, comm_sections
from gpucheck.records import read
from gpucheck.report import Status

LOGS = Path(__file__).parent / "data" / "nccl_logs"
LABELS = {0: "rank 0 (node 0 a)", 1: "rank 1 (node 1 b)"}


def _parse(name: str):  # type: ignore[no-untyped-def]
    return parse_nccl_log((LOGS / name).read_text())


def test_gloo_gets_no_nccl_variables() -> None:
    assert nccl_debug_env({}, "/tmp/run", "gloo") == {}


def test_a_healthy_infiniband_log_reads_as_ib_with_its_hcas_and_channels() -> None:
    t = _parse("ib_healthy.log")
    assert t.network == "IB"
    assert t.ib_devices == (("mlx5_0", "IB"), ("mlx5_1", "IB"), ("mlx5_2", "IB"),
                            ("mlx5_3", "IB"))
    assert t.oob_interface == "eth0"
    assert t.via == {"P2P": 2, "NET/IB": 3}


def test_roce_ports_are_told_from_infiniband() -> None:
    t = _parse("roce.log")
    assert t.ib_devices == (("mlx5_0", "RoCE"), ("mlx5_1", "RoCE"))
    assert t.via == {"NET/IB": 2, "SHM": 1}


def test_sockets_name_their_interfaces() -> None:
    assert _parse("sockets_with_ib.log").socket_interfaces == ("eth0",)
    t = _parse("socket_over_lo.log")
    assert (t.network, t.socket_interfaces) == ("Socket", ("lo", "docker0"))


def _entry(rank: int, log: str, ib_sysfs: list[str]) -> TransportEntry:
    return TransportEntry(rank, "read", asdict(_parse(log)), tuple(ib_sysfs))


def _statuses(entries: list[TransportEntry], nodes: int = 2) -> list[tuple[str, Status]]:
    _, findings = transport_view(entries, LABELS, "nccl", nodes)
    return [(f.check, f.status) for f in findings]


def test_infiniband_between_nodes_is_ok() -> None:
    entries = [_entry(0, "ib_healthy.log", ["mlx5_0"]), _entry(1, "roce.log", ["mlx5_0"])]
    assert _statuses(entries) == [("comm.transport.sockets_with_ib", Status.OK)]


def test_sockets_while_the_node_has_infiniband_is_a_warn() -> None:
    entries = [_entry(0, "sockets_with_ib.log", ["mlx5_0", "mlx5_1"]),
               _entry(1, "ib_healthy.log", ["mlx5_0"])]
    data, findings = transport_view(entries, LABELS, "nccl", 2)
    assert [(f.check, f.status, f.subject.label) for f in findings] == [
        ("comm.transport.sockets_with_ib", Status.WARN, "rank 0 (node 0 a)")]
    assert "mlx5_0, mlx5_1" in findings[0].message
    assert [r["network"] for r in data["ranks"]] == ["Socket", "IB"]


def test_sockets_over_loopback_or_a_bridge_are_a_warn_naming_them() -> None:
    _, findings = transport_view([_entry(0, "socket_over_lo.log", [])], LABELS, "nccl", 2)
    assert [(f.check, f.status) for f in findings] == [
        ("comm.transport.bad_interface", Status.WARN)]
    assert "lo, docker0" in findings[0].message


def test_on_one_node_nothing_goes_between_nodes_so_nothing_is_warned() -> None:
    assert _statuses([_entry(0, "socket_over_lo.log", ["mlx5_0"])], nodes=1) == []


def test_a_user_set_nccl_debug_says_the_transport_could_not_be_read() -> None:
    assert parse_nccl_log((LOGS / "user_set_debug.log").read_text()).network is None
    entries = [TransportEntry(0, "user_nccl_debug", None)]
    data, findings = transport_view(entries, LABELS, "nccl", 2)
    assert "set by the user" in data["transport"]
    assert [f.status for f in findings] == [Status.SKIP]


def test_the_logging_variables_are_set_around_the_group_and_restored_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "ALL")
    with nccl_logging("nccl") as folder:
        assert folder is not None and Path(folder).is_dir()
        assert os.environ["NCCL_DEBUG"] == "INFO"
        assert os.environ["NCCL_DEBUG_FILE"] == f"{folder}/nccl.%h.%p.log"
    assert "NCCL_DEBUG" not in os.environ and "NCCL_DEBUG_FILE" not in os.environ
    assert os.environ["NCCL_DEBUG_SUBSYS"] == "ALL"
    assert not Path(folder).exists()


def test_a_user_set_nccl_debug_gives_no_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    with nccl_logging("nccl") as folder:
        assert folder is None and os.environ["NCCL_DEBUG"] == "WARN"
    assert rank_entry(3, None)["state"] == "user_nccl_debug"


def test_a_rank_reads_the_log_named_by_its_own_pid(tmp_path: Path) -> None:
    text = (LOGS / "roce.log").read_text()
    (tmp_path / f"nccl.gpu-r07.{os.getpid()}.log").write_text(text)
    (tmp_path / f"nccl.gpu-r07.{os.getpid() + 1}.log").write_text("another rank's")
    entry = rank_entry(1, str(tmp_path))
    assert entry["state"] == "read" and entry["rank"] == 1
    assert list(entry["transport"]["ib_devices"]) == [("mlx5_0", "RoCE"), ("mlx5_1", "RoCE")]


def test_no_log_in_the_folder_is_said_so(tmp_path: Path) -> None:
    assert rank_entry(0, str(tmp_path))["state"] == "no_log"
    entry = read(TransportEntry, rank_entry(0, str(tmp_path)))
    data, findings = transport_view([entry], LABELS, "nccl", 2)
    assert data["transport"].startswith("no NCCL log found")
    assert [f.status for f in findings] == [Status.SKIP]


def test_the_gloo_report_says_the_transport_is_n_a() -> None:
    ranks = [{"rank": 0, "node_rank": 0, "host": "h", "device": "cpu"}]
    result = {"world_size": 1, "device": "cpu", "backend": "gloo", "iters": 1, "warmup": 0,
              "sizes_bytes": [1024], "ranks": ranks, "collectives": {}, "pairwise": None,
              "transport": None, "complete": True, "faults": []}
    sections = {s.name: s for s in comm_sections(result, Verdicts(0.5, None, 0.9))}
    assert sections["transport"].data == {
        "transport": "n/a (gloo): only NCCL logs its transport"}
    assert sections["transport"].findings == []


@pytest.mark.parametrize(("log", "interface"), [("socket_veth_cut_short.log", "veth1a2b3c"),
                                                ("socket_lo_cut_short.log", "lo")])
def test_a_socket_line_over_a_bridge_or_loopback_warns_without_a_using_network_line(
        log: str, interface: str) -> None:
    t = _parse(log)
    assert t.network is None and t.socket_interfaces == (interface,)
    data, findings = transport_view([_entry(1, log, [])], LABELS, "nccl", 2)
    assert [(f.check, f.status, f.subject.label) for f in findings] == [
        ("comm.transport.bad_interface", Status.WARN, "rank 1 (node 1 b)")]
    assert f"over {interface}," in findings[0].message
    assert data["ranks"][0]["network"] == "Socket"


def test_a_socket_line_over_veth_next_to_infiniband_devices_warns_twice() -> None:
    _, findings = transport_view([_entry(0, "socket_veth_cut_short.log", ["mlx5_0"])],
                                 LABELS, "nccl", 2)
    assert [(f.check, f.status) for f in findings] == [
        ("comm.transport.sockets_with_ib", Status.WARN),
        ("comm.transport.bad_interface", Status.WARN)]


def test_a_socket_line_over_a_proper_interface_with_no_infiniband_stays_ok() -> None:
    entries = [_entry(0, "socket_ens_cut_short.log", []), _entry(1, "sockets_with_ib.log", [])]
    _, findings = transport_view(entries, LABELS, "nccl", 2)
    (finding,) = findings
    assert finding.status is Status.OK and "over Socket," in finding.message


def test_no_transport_message_ever_says_none() -> None:
    logs = ["ib_healthy.log", "roce.log", "socket_ens_cut_short.log", "socket_lo_cut_short.log",
            "socket_veth_cut_short.log", "sockets_with_ib.log", "socket_over_lo.log"]
    for log in logs:
        for ib in ([], ["mlx5_0"]):
            _, findings = transport_view([_entry(0, log, ib)], LABELS, "nccl", 2)
            assert findings and all("None" not in f.message for f in findings), log
    # A log that names no network at all: said in words, not as None.
    entry = TransportEntry(0, "read", asdict(parse_nccl_log("NCCL INFO x")))
    (finding,) = transport_view([entry], LABELS, "nccl", 2)[1]
    assert finding.status is Status.OK and "does not name" in finding.message


def test_an_ib_log_with_no_using_network_line_reads_as_ib() -> None:
    text = (LOGS / "ib_healthy.log").read_text().replace("NCCL INFO Using network IB", "")
    entry = TransportEntry(0, "read", asdict(parse_nccl_log(text)), ("mlx5_0",))
    (finding,) = transport_view([entry], LABELS, "nccl", 2)[1]
    assert finding.status is Status.OK and "over IB," in finding.message
