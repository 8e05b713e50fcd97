"""What the job's command is handed, and what preflight leaves on disk (issue 34 item
10): a file rank 0 can no longer write stops the command on every rank, not only on rank
0; the command gets default signal dispositions and the launcher's mask; rank 0's store
going away is awaited without C++ noise; a stopped run leaves no stale exclude file.
Every -o on a pass, and SLURM's node name: tests/test_preflight_runs.py."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from comm_workers import PYTHON, ROOT, free_port, tracked
from test_preflight_runs import RUN_S, _slurm_ranks, _trained

from gpucheck.errors import Interrupted


def test_a_report_that_can_no_longer_be_written_starts_the_command_on_no_rank(
        tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    procs = _slurm_ranks(free_port(), "-q", "-o", str(folder / "pf.json"),
                         hooks=("--stress", "preflight_workers:remove_report_folder"),
                         PREFLIGHT_TEST_FOLDER=str(folder))
    with tracked(procs):
        outs = [p.communicate(timeout=RUN_S) for p in procs]
    assert [p.returncode for p in procs] == [2, 1], [e[-2000:] for _, e in outs]
    assert all(_trained(out) == [] for out, _ in outs)
    assert "started on no rank" in outs[0][1] and outs[0][1].count("\n") == 1
    assert "no-go" in outs[1][1]


SHOW_SIGNALS = "grep -E '^Sig(Ign|Blk)' /proc/self/status"


def test_the_command_gets_default_signal_dispositions_and_the_launchers_mask() -> None:
    code = ("from gpucheck.commands import preflight\n"
            "from gpucheck.preflight.actions import hold_sigterm\n"
            "hold_sigterm()\n"
            f"preflight._exec(['sh', '-c', {SHOW_SIGNALS!r}])\n")
    proc = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    masks = dict(line.split(":") for line in proc.stdout.splitlines())
    ignored, blocked = int(masks["SigIgn"], 16), int(masks["SigBlk"], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), sig.name
    assert blocked == 0


STORE_SERVER = """
import datetime, os, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True,
                      timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
store.set(sys.argv[2], "1")
store.wait(["polling"])
time.sleep(0.3)
os._exit(0)  # as rank 0 execs: its server's sockets close, mid-request
"""


def test_rank_zeros_store_going_away_is_awaited_without_cpp_noise(
        capfd: pytest.CaptureFixture[str]) -> None:
    import torch.distributed as dist

    from gpucheck.preflight import actions as handoff

    port, key = free_port(), handoff._ready_key(0)
    server = subprocess.Popen([sys.executable, "-c", STORE_SERVER, str(port), key])
    try:
        client = dist.TCPStore("127.0.0.1", port, 2, False,
                               timeout=datetime.timedelta(seconds=60))
        client.set("polling", "1")
        deadline = time.monotonic() + 20
        while handoff._still_served(client):
            assert time.monotonic() < deadline
    finally:
        server.wait(timeout=30)
    assert "recvValue" not in capfd.readouterr().err


def test_a_stopped_run_leaves_no_stale_exclude_file(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.cli import main
    from gpucheck.distributed import job

    exclude = tmp_path / "exclude.txt"
    exclude.write_text("node-of-the-last-run\n")

    def terminated(*args: object, **kwargs: object) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(job, "run_job", terminated)
    for name in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC"))] + \
            ["RANK", "WORLD_SIZE", "LOCAL_RANK"]:
        monkeypatch.delenv(name, raising=False)
    assert main(["preflight", "-q", "--exclude-file", str(exclude)]) == 143
    assert not exclude.exists()
