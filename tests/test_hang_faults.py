"""Faults on real ranks: killed, stopped, never joined, Ctrl-C, a busy port.

Each run is bounded (small --timeout, subprocess timeouts) and ends by checking that
no worker process is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
from comm_workers import (
    clean_env,
    free_port,
    gpucheck,
    start,
    tracked,
    wait_for_file,
    wait_gone,
)

from gpucheck.cli import main
from gpucheck.hang.findings import traces_section

TIMEOUT_S = 3
# The first size's results come within a second or two (300 calls of 1 KiB), then the
# sweep runs on for minutes (up to 64 MiB): a fault sent after the first results lands
# mid-run, and the test waits little for them.
LONG_SWEEP = ("--max-bytes", "64M", "--iters", "300", "--warmup", "1", "--no-pairwise")


def _failed(report: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {f["check"]: f["message"] for s in report["sections"] for f in s["findings"]
            if f["status"] == "FAIL"}


def _fault_mid_run(tmp_path: Path, sig: signal.Signals, *args: str,
                   **env: str) -> tuple[int, dict, list[int]]:  # type: ignore[type-arg]
    """Start a sweep, send `sig` to rank 1 once results exist; wait for the end."""
    run, out = tmp_path / "run", tmp_path / "out.json"
    run.mkdir()
    proc = start(gpucheck("comm", *args, "--timeout", str(TIMEOUT_S), *LONG_SWEEP, "-q",
                          "-o", str(out)), clean_env(GPUCHECK_RUN_DIR=str(run), **env))
    with tracked([proc]) as seen:
        roster = wait_for_file(run / "roster.json", 90, proc)
        assert roster is not None, proc.communicate()
        seen.extend(r["pid"] for r in roster)
        assert wait_for_file(run / "partial.json", 60, proc) is not None
        os.kill(roster[1]["pid"], sig)
        proc.communicate(timeout=TIMEOUT_S + 40)
        left = wait_gone(list(seen), within_s=5)
        return proc.returncode, json.loads(out.read_text()), left


def test_a_killed_rank_is_named_with_its_signal_and_partial_results_kept(
        tmp_path: Path) -> None:
    code, report, left = _fault_mid_run(tmp_path, signal.SIGKILL, "--n-gpus", "2")
    assert code == 1
    failed = _failed(report)
    assert "rank 1" in failed["comm.rank_failed"] and "SIGKILL" in failed["comm.rank_failed"]
    assert report["sections"][1]["data"]["results"], "the sizes measured before are kept"
    assert left == []


def test_a_stopped_rank_is_named_within_the_timeout_and_killed_and_its_dumps_name_it(
        tmp_path: Path) -> None:
    """gpucheck's own comm arms the Flight Recorder; rank 1 stops; the survivors dump
    after their collective times out; `gpucheck hang --traces` names rank 1."""
    fr = tmp_path / "fr"
    fr.mkdir()
    # --device cpu: gloo ranks, whose dumps are read here, on any machine.
    code, report, left = _fault_mid_run(tmp_path, signal.SIGSTOP, "--device", "cpu",
                                        "--n-gpus", "3",
                                        TORCH_FR_DUMP_TEMP_FILE=str(fr / "comm_rank_"))
    assert code == 1
    failed = _failed(report)
    assert "rank 1" in failed["comm.rank_unresponsive"]
    assert set(failed) == {"comm.rank_unresponsive"}, failed
    assert left == []
    section = traces_section(str(fr), None)
    assert section.data["ranks_dumped"] == [0, 2]
    assert [(f.check, f.subject.label) for f in section.findings] == [
        ("hang.traces.no_dump", "rank 1")]
    # The failed run's report says where the dumps went, and the CLI reads them back.
    said = [f for s in report["sections"] for f in s["findings"]
            if f["check"] == "comm.flight_recorder"]
    assert [f["status"] for f in said] == ["OK"] and str(fr) in said[0]["message"]
    out = tmp_path / "hang.json"
    assert main(["hang", "--traces", str(fr), "-q", "-o", str(out)]) == 1
    findings = json.loads(out.read_text())["sections"][0]["findings"]
    assert [(f["check"], f["subject"]) for f in findings] == [("hang.traces.no_dump", "rank 1")]


def _rank_env(rank: int, port: int, run: Path) -> dict[str, str]:
    return clean_env(RANK=str(rank), WORLD_SIZE="3", LOCAL_RANK=str(rank),
                     LOCAL_WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def test_a_rank_that_never_joins_is_named_by_the_check_in(tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "out.json"
    args = ("comm", "--timeout", str(TIMEOUT_S), "--max-bytes", "4K", "--iters", "1")
    rank0 = start(gpucheck(*args, "-q", "-o", str(out)), _rank_env(0, port, tmp_path))
    rank2 = start(gpucheck(*args), _rank_env(2, port, tmp_path))
    with tracked([rank0, rank2]) as seen:
        seen.extend([rank0.pid, rank2.pid])
        _, err2 = rank2.communicate(timeout=TIMEOUT_S + 60)
        rank0.communicate(timeout=TIMEOUT_S + 30)
        assert (rank0.returncode, rank2.returncode) == (1, 1)
        failed = _failed(json.loads(out.read_text()))
        assert "rank 1 (expected node 0, local rank 1)" in failed["comm.checkin"]
        assert "rank 1" in err2 and "never checked in" in err2
        assert wait_gone(list(seen)) == []


def test_ctrl_c_ends_every_worker_and_exits_130(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out.json"
    run.mkdir()
    proc = start(gpucheck("comm", "--n-gpus", "2", "--timeout", "30", *LONG_SWEEP, "-q",
                          "-o", str(out)), clean_env(GPUCHECK_RUN_DIR=str(run)))
    with tracked([proc]) as seen:
        roster = wait_for_file(run / "roster.json", 90, proc)
        assert roster is not None, proc.communicate()
        seen.extend(r["pid"] for r in roster)
        assert wait_for_file(run / "partial.json", 60, proc) is not None
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert wait_gone(list(seen)) == []
        assert "comm.interrupted" in _failed(json.loads(out.read_text()))


def test_a_port_in_use_is_a_clear_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        code = main(["comm", "--master-port", str(sock.getsockname()[1])])
    assert code == 2
    assert "in use" in capsys.readouterr().err
