"""`gpucheck preflight`'s judgement, budget and actions on recorded figures: the
512-node elimination, SKIP or FAIL for an unfinished check, the exclude file, the
drain (scontrol replaced by a recording stand-in), and the command line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_preflight_gaps import result_of

from gpucheck import cli
from gpucheck.comm.internode import round_schedule
from gpucheck.comm.internode_verdicts import find_node_suspects
from gpucheck.context import Console
from gpucheck.preflight import actions
from gpucheck.preflight.verdict import confirmed_slow_nodes, decide
from gpucheck.preflight.worker import LINK_SHIFTS, Budget
from gpucheck.report import Report, Section, ok, warn

NODES = 512
SLOW = 137


def _links(slow: int | None, nodes: int = NODES) -> list[dict]:
    """One rail per node, the two ring shifts; `slow` sends and receives at 1/5."""
    links = []
    for pairs in round_schedule(nodes, LINK_SHIFTS):
        for src, dst in pairs:
            gbps = 20.0 if slow in (src, dst) else 100.0 - (src * 7 + dst) % 5
            links.append({"round": (dst - src) % nodes, "src_node": src, "dst_node": dst,
                          "rail": 0, "src": src, "dst": dst, "bandwidth_gbps": gbps,
                          "samples_gbps": [gbps, gbps * 0.99, gbps * 0.98]})
    return links


def _again(links: list[dict], pairs: set[tuple[int, int]], slow_again: bool) -> list[dict]:
    out = []
    for link in links:
        if (link["src_node"], link["dst_node"]) in pairs:
            gbps = link["bandwidth_gbps"] if slow_again else 99.0
            out.append(link | {"round": "again", "samples_gbps": [gbps, gbps, gbps]})
    return out


def test_two_ring_shifts_whatever_the_node_count() -> None:
    assert len(round_schedule(NODES, LINK_SHIFTS)) == 2
    assert len(round_schedule(4, LINK_SHIFTS)) == 2
    assert round_schedule(2, LINK_SHIFTS) == [[(0, 1), (1, 0)]]
    assert len(round_schedule(NODES)) == NODES - 1  # comm's full schedule is unchanged


def test_a_slow_node_among_512_is_named_alone_by_elimination() -> None:
    suspects = find_node_suspects(_node_samples(_links(SLOW)), 0.5)
    assert suspects.members == {SLOW: "both"}
    assert find_node_suspects(_node_samples(_links(None)), 0.5).empty


def _node_samples(links: list[dict]) -> dict:
    from gpucheck.comm.internode_verdicts import node_pair_rows, node_samples

    return node_samples(node_pair_rows(links))


def test_the_slow_node_is_condemned_only_when_slow_again_beside_a_known_good_one() -> None:
    from gpucheck.comm.internode import exchanges_for

    # 32 nodes (the elimination among 512: the test above): three judgements of them.
    links = _links(SLOW % 32, 32)
    suspects = find_node_suspects(_node_samples(links), 0.5)
    wanted = {p for x, y in exchanges_for(suspects) for p in ((x, y), (y, x))}
    assert suspects.references  # a known-good pair is measured beside the suspect's
    confirmed = {"links": links, "again": _again(links, wanted, slow_again=True)}
    assert confirmed_slow_nodes(confirmed, 0.5) == [SLOW % 32]
    unstable = {"links": links, "again": _again(links, wanted, slow_again=False)}
    assert confirmed_slow_nodes(unstable, 0.5) == []
    assert confirmed_slow_nodes({"links": links, "again": []}, 0.5) == []


def _result(checks: dict, strict: bool = False, stress: dict | None = None) -> dict:
    return result_of(checks, nodes=2, strict=strict, stress=stress)


def _sdc(wrong_rank: int | None) -> dict:
    records = [{"rank": r, "dtype": "bf16", "size": 64, "mode": "bitwise", "iters": 10,
                "duration_s": 1.0, "bad_iters": 0, "first_bad_iter": None,
                "worst_elements": 0, "p50_ms": 1.0, "p99_ms": 1.1,
                "digest": "bad" if r == wrong_rank else "good", "group": "H100"}
               for r in range(4)]
    return {"sdc": {"dtype": "bf16", "size": 64, "duration_s": 1.0, "tolerance": 0.02,
                    "rows_checked": 64, "records": records,
                    "reference_deviations": [0.5 if r == wrong_rank else 0.001
                                             for r in range(4)]}}


def test_a_wrong_product_is_a_no_go_naming_its_node_rank_and_gpu() -> None:
    decision = decide(_result({"sdc": {"state": "done"}}, stress=_sdc(2)))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert (node["host"], node["node_rank"], node["ranks"], node["gpus"]) == \
        ("gpu-b", 1, [2], ["cuda:0"])
    head = decision["sections"][0]
    assert [(f["check"], f["subject"], f["action"]) for f in head["findings"]] == \
        [("preflight.node", "gpu-b", "drain-node")]


def test_healthy_figures_are_a_go() -> None:
    decision = decide(_result({"sdc": {"state": "done"}}, stress=_sdc(None)))
    assert decision["go"] is True and decision["failing"] == []


def test_an_unfinished_check_is_a_skip_and_with_strict_a_fail() -> None:
    checks = {"links": {"state": "unfinished", "reason": "2 s of the 60 s budget left"}}
    lenient = decide(_result(checks))
    assert lenient["go"] is True
    budget = next(s for s in lenient["sections"] if s["name"] == "budget")
    assert [(f["status"], f["subject"]) for f in budget["findings"]] == [("SKIP", "links")]
    strict = decide(_result(checks, strict=True))
    assert strict["go"] is False and strict["failing"] == []


def test_the_budget_counts_down_from_its_start() -> None:
    now = [100.0]
    budget = Budget(60, clock=lambda: now[0])
    now[0] = 130.0
    assert budget.left_here() == 30.0
    now[0] = 200.0
    assert budget.left_here() == 0.0


def test_the_exclude_file_is_written_when_empty_and_names_only_safe_hosts(
        tmp_path: Path) -> None:
    path = tmp_path / "exclude"
    assert actions.write_exclude_file(str(path), []) == []
    assert path.read_text() == ""
    failing = [{"host": "gpu-b"}, {"host": "gpu-a"}, {"host": "bad\nhost"}, {"host": "gpu-b"}]
    assert actions.write_exclude_file(str(path), failing) == ["gpu-a", "gpu-b"]
    assert path.read_text() == "gpu-a\ngpu-b\n"


@pytest.fixture
def recording_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `scontrol` first on PATH that records its arguments, one a line."""
    record = tmp_path / "scontrol.args"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return record


NODE = {"host": "gpu-b", "node_rank": 1, "ranks": [2], "gpus": ["cuda:0"],
        "checks": ["preflight.sdc"], "why": ['deviates 0.5 "from" the reference\n']}


def test_drain_runs_scontrol_for_its_own_failing_node(recording_scontrol: Path) -> None:
    done = actions.drain_node(NODE, "cuda", under_slurm=True, drain=True)
    assert done is not None and done["ran"] and done["exit_code"] == 0
    args = recording_scontrol.read_text().splitlines()
    assert args[:4] == ["update", "NodeName=gpu-b", "State=DRAIN",
                        args[3]] and args[3].startswith("Reason=gpucheck preflight: ")
    assert '"' not in args[3] and len(args) == 4


@pytest.mark.parametrize(("device", "slurm", "drain"), [
    ("cpu", True, True), ("cuda", True, False), ("cuda", False, True)])
def test_drain_only_prints_the_command_otherwise(recording_scontrol: Path, device: str,
                                                 slurm: bool, drain: bool) -> None:
    done = actions.drain_node(NODE, device, under_slurm=slurm, drain=drain)
    assert done is not None and not done["ran"]
    assert done["command"].startswith("scontrol update NodeName=gpu-b State=DRAIN")
    assert not recording_scontrol.exists()


def test_a_command_not_on_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["preflight", "--", "no-such-command-gpucheck"]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, **faults: dict) -> None:
    import sys

    from tests.fake_pynvml import FakeGpu, FakeNvml

    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(2)]
    for key, changes in faults.items():
        for attr, value in changes.items():
            setattr(gpus[int(key[3:])], attr, value)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)


def _by_check(findings: list[dict], check: str) -> list[tuple[str, str]]:
    return [(f["status"], f["subject"][:5]) for f in findings if f["check"] == check]


def test_nvml_counts_only_other_processes_as_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.preflight.worker import nvml_findings

    _fake_nvml(monkeypatch, gpu0={"pids": [111]}, gpu1={"pids": [4242]})
    found = nvml_findings("cuda", own_pids=[111, 112], environ=os.environ)
    assert _by_check(found, "gpu.busy") == [("OK", "GPU 0"), ("WARN", "GPU 1")]


def test_nvml_fail_condemns_its_node_and_a_healthy_node_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.preflight.worker import nvml_findings

    _fake_nvml(monkeypatch, gpu1={"ecc_volatile_unc": 3, "ecc_aggregate_unc": 3})
    bad = nvml_findings("cuda", environ=os.environ)
    _fake_nvml(monkeypatch)
    good = nvml_findings("cuda", environ=os.environ)
    assert [f for f in good if f["status"] == "FAIL"] == []
    nodes = [{"node_rank": 0, "findings": good}, {"node_rank": 1, "findings": bad}]
    decision = decide(_result({"nvml": {"state": "done", "nodes": nodes}}))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert node["host"] == "gpu-b" and node["checks"] == ["gpu.ecc.volatile_uncorrected"]
    assert str(node["gpus"][0]).startswith("GPU 1")


def test_an_exclude_file_that_is_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert cli.main(["preflight", "--exclude-file", str(tmp_path)]) == 2


def test_the_line_format_gives_the_failing_node_in_one_line() -> None:
    from gpucheck.commands.preflight import _report
    from gpucheck.render import render

    text = render(_report(decide(_result({"sdc": {"state": "done"}}, stress=_sdc(2))),
                          None), "line")
    assert text.count("\n") <= 1 and "preflight.node" in text and "gpu-b" in text


@pytest.mark.parametrize(("local_rank", "host", "drained"), [
    (0, "gpu-b", True), (1, "gpu-b", False), (0, "gpu-a", False)])
def test_only_the_failing_node_own_rank_0_drains_it(
        recording_scontrol: Path, monkeypatch: pytest.MonkeyPatch, local_rank: int,
        host: str, drained: bool) -> None:
    import argparse
    from types import SimpleNamespace

    from gpucheck.commands import preflight
    from gpucheck.distributed import world

    monkeypatch.setattr(world, "host_name", lambda: host)
    monkeypatch.setitem(preflight.STARTED_ENVIRONMENT, "SLURM_JOB_ID", "77")
    me = SimpleNamespace(local_rank=local_rank, node_rank=1, rank=2 + local_rank)
    preflight._drain(argparse.Namespace(drain=True), SimpleNamespace(device="cuda"),
                     {"failing": [NODE]}, me)
    assert recording_scontrol.exists() is drained


# --- what a passing gate prints before the job (issue 36 item 3) -----------------------

def _passed(problems: int) -> Report:

    findings = [ok("preflight.go", "2 rank(s) on 1 node(s) passed: the command starts on "
                   "every rank")] + [warn("gpu.busy", f"GPU {n} is busy", "look at it")
                                     for n in range(problems)]
    return Report("preflight", [Section("preflight", "Preflight: go / no-go", {"go": True},
                                        findings)] + [
        Section(f"s{n}", f"Section {n}", {f"key_{k}": k for k in range(10)}) for n in range(12)])


def test_a_passing_gate_prints_one_screen_and_writes_the_full_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import time

    from gpucheck.commands import preflight

    out = tmp_path / "pf.json"
    args = argparse.Namespace(format=None, quiet=False, outputs=[str(out)], output=None,
                              baseline=None)
    preflight._show(_passed(1), args, time.monotonic() - 38, Console.of_process())
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("gpucheck preflight on ") and shown[0].endswith(" in 38 s")
    assert any("[WARN] gpu.busy" in line for line in shown)
    assert shown[-1] == f"Full report: {out}" and len(shown) < 10
    assert len(json.loads(out.read_text())["sections"]) == 13


def test_the_gate_summary_keeps_to_one_screen_however_many_problems() -> None:
    from gpucheck.render.text import BRIEF_PROBLEM_LINES, render_brief

    lines = render_brief(_passed(40), 12.0, []).splitlines()
    assert len(lines) <= BRIEF_PROBLEM_LINES + 4
    assert lines[-2].strip().endswith("more in the full report")
    assert lines[-1] == "Full report: not kept (add -o FILE.json)"


def test_a_gate_without_a_command_does_not_say_one_starts() -> None:
    from gpucheck.preflight.verdict import verdict_section

    result = {"world_size": 2, "ranks": [{"rank": r, "node_rank": 0, "host": "vm"}
                                         for r in range(2)], "command_given": False}
    (go,) = verdict_section(result, [], True).findings
    assert "none starts" in go.message and "the command starts" not in go.message
