"""`torchrun --nproc-per-node 2 -m gpucheck all`: every rank runs the sequence, and each
command's process group is joined and left in turn in the same processes (two torchrun
ranks of stress alone: test_stress_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

from comm_workers import PYTHON, clean_env, free_port, start, tracked, wait_gone

RUN_S = 300


def test_all_under_torchrun_joins_one_process_group_per_command_in_turn(
        tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--max-restarts", "0", "-m", "gpucheck", "all", "--skip", "stress,bench",
                "--timeout", "60", "-q", "-o", str(out)]
    proc = start(torchrun, clean_env())
    with tracked([proc]) as seen:
        _stdout, stderr = proc.communicate(timeout=RUN_S)
        assert proc.returncode == 0, stderr[-3000:]
        assert wait_gone(seen) == []
    report = json.loads(out.read_text())
    summary = report["sections"][0]
    rows = {r["command"]: r for r in summary["data"]["commands"]}
    # env (the gather group), then comm: two groups, one after another.
    assert [rows[c]["outcome"] for c in ("env", "stress", "bench", "comm")] == [
        "ran", "skipped", "skipped", "ran"]
    sections = {s["name"]: s for s in report["sections"]}
    assert sections["comm.comm"]["data"]["world_size"] == 2
    assert any(name.startswith("env.") for name in sections)
