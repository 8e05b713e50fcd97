"""Progress on a terminal (stderr on a pseudo-terminal, stdout on a pipe): every command
says what it is doing, from the reporting process only; nothing off a terminal or with -q."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from comm_workers import ROOT, clean_env, gpucheck, kill_tree

from gpucheck.context import RunContext, RunOptions
from gpucheck.distributed import progress

RUN_S = 180  # spawning ranks and loading torch on a busy 2-core machine
TINY_COMM = ("comm", "--max-bytes", "2K", "--iters", "1", "--warmup", "0", "--timeout", "60")
TINY_STRESS = ("stress", "--duration", "0.2", "--size", "32", "--dtypes", "fp32",
               "--timeout", "60")


def run_on_pty(*argv: str, stderr_on_pty: bool = True) -> tuple[int, str, str]:
    """(exit code, what the terminal showed, stdout) of `gpucheck ARGV`, stderr on a
    pseudo-terminal (or on a pipe when not `stderr_on_pty`); killed past RUN_S."""
    main, child = os.openpty()
    # A terminal has a size (a new pseudo-terminal has 0 x 0): 40 rows of 160 columns.
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(gpucheck(*argv), cwd=ROOT, env=clean_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=child if stderr_on_pty else subprocess.STDOUT,
                            start_new_session=True)
    os.close(child)
    shown = bytearray()
    try:
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: every holder of the terminal has closed it
                    chunk = b""
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=30)
    finally:
        kill_tree([proc], [])
        os.close(main)
    return proc.returncode, shown.decode(errors="replace"), out


@pytest.fixture(scope="module")
def comm_on_terminal() -> tuple[int, str, str]:
    # Through `all` (env, then comm on two ranks): one run for both commands' progress.
    return run_on_pty("all", "--skip", "stress,bench", "--n-gpus", "2")


def test_all_and_comm_on_a_terminal_say_each_step_the_ranks_and_each_collective_and_size(
        comm_on_terminal: tuple[int, str, str]) -> None:
    code, shown, out = comm_on_terminal
    assert code in (0, 1), shown + out
    assert "all: step 1 of 2: gpucheck env" in shown and "env: probing" in shown
    assert "all: step 2 of 2: gpucheck comm" in shown
    assert "loading torch" in shown and "launching 2 ranks" in shown
    assert "2 rank(s) joined the process group (gloo, cpu)" in shown
    assert "comm: all_reduce 1 KiB" in shown and "comm: all_gather 2 KiB" in shown
    assert "comm: pairwise send/recv" in shown
    assert "measured: the ranks stop" in shown
    assert shown.count("joined the process group") == 1, "rank 1 must stay quiet"


def test_progress_never_reaches_the_report_on_stdout(
        comm_on_terminal: tuple[int, str, str]) -> None:
    _, _, out = comm_on_terminal
    assert "gpucheck all" in out
    assert "launching" not in out and "\r" not in out


def test_stress_on_a_terminal_names_each_phase() -> None:
    code, shown, out = run_on_pty(*TINY_STRESS, "--n-gpus", "1")
    assert code in (0, 1), shown + out
    assert "stress: gemm fp32 32^3" in shown
    assert "stress: sdc burn-in, 0.2 s of fp32 products" in shown


def test_bench_on_a_terminal_names_its_warm_up_and_timed_loop() -> None:
    code, shown, out = run_on_pty("bench", "--model", "mobilenet_v3_small", "--batch-size",
                                  "1", "--warmup", "1", "--iters", "2", "--n-gpus", "1")
    assert code in (0, 1), shown + out
    assert "bench: warm-up" in shown and "bench: timed" in shown


def test_quiet_on_a_terminal_shows_no_progress() -> None:
    code, shown, out = run_on_pty(*TINY_COMM, "--n-gpus", "1", "-q")
    assert code == 0, shown + out
    assert "comm:" not in shown and "rank" not in shown


def test_off_a_terminal_nothing_but_the_report_is_written() -> None:
    code, shown, out = run_on_pty(*TINY_COMM, "--n-gpus", "1", stderr_on_pty=False)
    assert code == 0, shown + out
    assert shown == ""
    assert "comm: all_reduce" not in out and "in this process" not in out


# --- what a run shows and keeps lives on its context (issue 25, no module state) -------

class _Terminal:
    """A stderr that is a terminal (nothing is written to it in these tests)."""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _rank_shows(options: RunOptions, environ: dict[str, str],
                monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether a rank gpucheck started (job.in_context, its variables set by the agent)
    shows progress, given the options the launching process pickled for it."""
    from gpucheck.distributed import job

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return bool(job.in_context(lambda ctx, spec: progress.enabled(ctx), None, options))


def test_the_progress_decision_reaches_the_ranks_in_their_options_not_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import sys

    from gpucheck import cli

    monkeypatch.setattr(sys, "stderr", _Terminal())
    monkeypatch.delenv("GPUCHECK_PROGRESS", raising=False)
    shown = cli.context(argparse.Namespace(quiet=False), RunOptions(), {}).options
    quiet = cli.context(argparse.Namespace(quiet=True), RunOptions(), {}).options
    assert (shown.show_progress, quiet.show_progress) == (True, False)
    assert "GPUCHECK_PROGRESS" not in os.environ
    rank = {"WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert _rank_shows(shown, rank | {"RANK": "0"}, monkeypatch)
    assert not _rank_shows(shown, rank | {"RANK": "1"}, monkeypatch)  # one reporter
    assert not _rank_shows(quiet, rank | {"RANK": "0"}, monkeypatch)
    # The process's own setting of the old variable changes nothing.
    monkeypatch.setenv("GPUCHECK_PROGRESS", "1")
    assert not _rank_shows(quiet, rank | {"RANK": "0"}, monkeypatch)


def test_the_users_run_directory_is_read_once_where_the_run_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from gpucheck import cli

    monkeypatch.setenv("GPUCHECK_RUN_DIR", str(tmp_path / "elsewhere"))
    assert progress.run_dir(RunContext()) is None  # never read below the boundary
    ns = argparse.Namespace(quiet=True)
    given = cli.context(ns, RunOptions(), {"GPUCHECK_RUN_DIR": str(tmp_path)})
    assert progress.run_dir(given) == tmp_path
    assert cli.context(ns, RunOptions(), {}).options.run_dir is None
    kept = cli.context(ns, RunOptions(run_dir="/from/a/test"), {"GPUCHECK_RUN_DIR": "/x"})
    assert kept.options.run_dir == "/from/a/test"


def test_each_run_keeps_its_own_progress_and_bars_shared_only_by_its_commands() -> None:
    one, other = RunContext(RunOptions(show_progress=True)), RunContext()
    progress.set_step(one, "all_reduce 4 MiB")
    progress.publish_partial(one, {"measured": 1})
    assert (other.progress.step, progress.local_partial(other)) == (None, None)
    command = one.scoped("bench")
    assert command.progress.step == "all_reduce 4 MiB"
    with progress.bar(command, "bench", 2) as opened:
        assert one.bars == [opened] and other.bars == []
    assert one.bars == []
    progress.reset(command)  # a new job in the same run: in place, for every command
    assert progress.local_partial(one) is None
