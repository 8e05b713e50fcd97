"""Stopping a run (Ctrl-C, SIGTERM, SIGHUP): the workers stop, the partial report with a
`<command>.interrupted` FAIL, one line on stderr, exit 128 + the signal, no process left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from comm_workers import (
    PYTHON,
    clean_env,
    free_port,
    gpucheck,
    start,
    tracked,
    wait_for_file,
    wait_gone,
)

from gpucheck.cli import main
from gpucheck.errors import Interrupted

START_S = 120  # spawning ranks and loading torch on a busy 2-core machine
END_S = 60
LONG_BENCH = ("bench", "--model", "mobilenet_v3_small", "--batch-size", "1", "--warmup", "1",
              "--iters", "5000", "--timeout", "30")
LONG_COMM = ("comm", "--max-bytes", "64K", "--iters", "3000", "--warmup", "1", "--no-pairwise",
             "--timeout", "30")


def interrupted(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for s in report["sections"] for f in s["findings"]
            if f["check"].endswith(".interrupted") and f["status"] == "FAIL"]


def one_line(stderr: str, command: str) -> str:
    """The only line on stderr, which must be gpucheck's own (no traceback, no torch log)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"gpucheck {command}: "), stderr
    return lines[0]


# The command as a terminal starts it, hearing SIGHUP, even when this test run itself
# was started under nohup (its ignored SIGHUP would pass down to the command).
HEARS_HANGUPS = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                 "os.execv(sys.argv[1], sys.argv[1:])")


def stop_mid_run(tmp_path: Path, sig: signal.Signals, *argv: str,
                 whole_group: bool = False) -> tuple[int, str, dict[str, Any]]:
    """Start `gpucheck ARGV -o FILE`, send `sig` once rank 0 has published a result
    (to the whole process group when `whole_group`, as a terminal's Ctrl-C does);
    return (exit code, stderr, the report)."""
    run, out = tmp_path / "run", tmp_path / "out.json"
    run.mkdir()
    proc = start([PYTHON, "-c", HEARS_HANGUPS, *gpucheck(*argv, "-q", "-o", str(out))],
                 clean_env(GPUCHECK_RUN_DIR=str(run)))
    with tracked([proc]) as seen:
        assert wait_for_file(run / "partial.json", START_S, proc) is not None, \
            proc.communicate()
        seen.extend(r["pid"] for r in wait_for_file(run / "roster.json", 5) or [])
        seen.extend(p.pid for p in _children(proc))
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=END_S)
        assert wait_gone(seen) == [], "a worker outlived the command"
    return proc.returncode, err, json.loads(out.read_text())


def _children(proc: subprocess.Popen[str]) -> list[Any]:
    import psutil

    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


# Ctrl-C to a self-launched bench's whole group (exit 130, one line, the partial
# report): test_bench_partial.py's Ctrl-C run, which also checks the timed iterations kept.


def test_a_hangup_stops_a_self_launched_bench_with_its_partial_report_and_129(
        tmp_path: Path) -> None:
    code, err, report = stop_mid_run(tmp_path, signal.SIGHUP, *LONG_BENCH, "--n-gpus", "2",
                                     whole_group=True)
    assert code == 129
    one_line(err, "bench")
    assert interrupted(report)
    partial = next(s for s in report["sections"] if s["name"] == "partial")
    assert partial["data"]["rank0_warmup"]["iters"] == 1


def test_a_bench_under_nohup_outlives_its_terminals_hangup(tmp_path: Path) -> None:
    # SIGHUP to the whole group mid-run, as a closing terminal sends it: under nohup
    # neither gpucheck nor torch's agent nor a rank may stop for it.
    run, out = tmp_path / "run", tmp_path / "out.json"
    run.mkdir()
    argv = ["nohup", *gpucheck("bench", "--model", "mobilenet_v3_small", "--batch-size", "1",
                               "--warmup", "1", "--iters", "120", "--n-gpus", "2", "-q",
                               "-o", str(out))]
    proc = start(argv, clean_env(GPUCHECK_RUN_DIR=str(run)))
    with tracked([proc]) as seen:
        assert wait_for_file(run / "partial.json", START_S, proc) is not None, \
            proc.communicate()
        seen.extend(p.pid for p in _children(proc))
        os.killpg(proc.pid, signal.SIGHUP)
        _, err = proc.communicate(timeout=START_S)
        assert wait_gone(seen) == []
    assert proc.returncode in (0, 1), err  # 1: a WARN (a CPU straggler) is a finished run
    report = json.loads(out.read_text())
    assert not interrupted(report)
    timing = next(s for s in report["sections"] if s["name"] == "timing")
    assert [r["images"] for r in timing["data"]["ranks"]] == [120, 120]


def test_sigterm_stops_a_self_launched_comm_with_the_sizes_measured_and_143(
        tmp_path: Path) -> None:
    # To gpucheck alone (`kill PID`, `timeout`): its agent stops the ranks.
    code, err, report = stop_mid_run(tmp_path, signal.SIGTERM, *LONG_COMM, "--n-gpus", "2")
    assert code == 143
    assert "terminated by SIGTERM" in one_line(err, "comm")
    assert "SIGTERM" in interrupted(report)[0]["message"]
    all_reduce = next(s for s in report["sections"] if s["name"] == "all_reduce")
    assert all_reduce["data"]["results"], "the sizes measured before the signal are kept"


def test_sigterm_stops_a_one_process_bench_with_its_partial_report_and_143(
        tmp_path: Path) -> None:
    code, err, report = stop_mid_run(tmp_path, signal.SIGTERM, *LONG_BENCH, "--n-gpus", "1")
    assert code == 143
    one_line(err, "bench")
    assert interrupted(report) and report["sections"][0]["name"] == "partial"


def _srun_env(rank: int, port: int, run: Path) -> dict[str, str]:
    return clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                     SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), GPUCHECK_RUN_DIR=str(run))


def test_sigterm_to_every_srun_task_writes_rank_0s_report_and_each_exits_143(
        tmp_path: Path) -> None:
    run, out, port = tmp_path / "run", tmp_path / "out.json", free_port()
    run.mkdir()
    # srun gives every task the same command line, --output included.
    tasks = [start(gpucheck(*LONG_BENCH, "-q", "-o", str(out)), _srun_env(r, port, run))
             for r in range(2)]
    with tracked(tasks) as seen:
        seen.extend(t.pid for t in tasks)
        assert wait_for_file(run / "partial.json", START_S, tasks[0]) is not None, \
            tasks[0].communicate()
        for task in tasks:  # a time limit signals every task of the step
            task.send_signal(signal.SIGTERM)
        errs = [t.communicate(timeout=END_S)[1] for t in tasks]
        assert [t.returncode for t in tasks] == [143, 143], errs
        assert wait_gone(seen) == []
    assert "partial report in" in one_line(errs[0], "bench")
    assert "partial report in" not in one_line(errs[1], "bench")
    report = json.loads(out.read_text())
    assert interrupted(report) and report["sections"][0]["name"] == "partial"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_spawned_rank_ends_at_once_and_silently_on_a_stop_signal(
        sig: signal.Signals) -> None:
    # Ctrl-C reaches the rank from the terminal, then again from the agent stopping it.
    code = ("import time; from gpucheck.distributed.launch import rank_main; "
            "rank_main(lambda: (print('ready', flush=True), time.sleep(60)))")
    proc = start([PYTHON, "-c", code], clean_env())
    with tracked([proc]):
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(sig)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=END_S)
    assert (proc.returncode, err) == (128 + sig, "")


def test_a_rank_born_with_ctrl_c_ignored_still_ends_at_once_on_it() -> None:
    # A background job of a non-interactive shell (a CI script's `cmd &`) starts with
    # SIGINT ignored; only an ignored SIGHUP (nohup) is kept as the user's wish.
    code = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "from gpucheck.distributed.launch import rank_main; "
            "rank_main(lambda: (print('ready', flush=True), time.sleep(60)))")
    proc = start([PYTHON, "-c", code], clean_env())
    with tracked([proc]):
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=END_S)
    assert (proc.returncode, err) == (130, "")


def test_a_stop_before_anything_was_measured_still_writes_a_report_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpucheck.commands import bench

    def stopped(args: Any, ctx: Any) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(bench, "run", stopped)
    out = tmp_path / "out.json"
    assert main(["bench", "-q", "-o", str(out)]) == 143
    assert one_line(capsys.readouterr().err, "bench").endswith(f"partial report in {out}")
    report = json.loads(out.read_text())
    assert [s["name"] for s in report["sections"]] == ["interrupted"]
    assert report["sections"][0]["data"]["results_above"] == "none"


def test_main_gives_back_the_sigterm_handler_it_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    main(["comm", "--iters", "0"])
    assert signal.getsignal(signal.SIGTERM) is before


