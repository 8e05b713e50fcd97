"""`gpucheck hang` across nodes: one gpucheck per node (as srun --ntasks-per-node 1 or
torchrun with one process per node starts it), each looking at its own ranks, rank 0
judging them all. Two "nodes" on 127.0.0.1: node 0 runs ranks 0 and 1 of the job,
node 1 runs rank 2, which is stuck in its own code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.comm_workers import clean_env, free_port
from tests.hang_launch import hang_job


def _gpucheck_node(node: int, pids: list[int], port: int, out: Path) -> subprocess.Popen[str]:
    env = clean_env(RANK=str(node), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    args = [sys.executable, "-m", "gpucheck", "hang", *map(str, pids), "--window", "1", "-q",
            "-o", str(out)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_the_rank_on_another_node_is_named_with_its_node(tmp_path: Path) -> None:
    with hang_job("user", odd=2, nodes=[0, 0, 1]) as job:
        port, out = free_port(), tmp_path / "hang.json"
        nodes = [_gpucheck_node(0, job.pids[:2], port, out),
                 _gpucheck_node(1, job.pids[2:], port, tmp_path / "unused.json")]
        try:
            codes = [p.wait(timeout=180) for p in nodes]
        finally:
            for p in nodes:
                p.kill()
                p.wait(timeout=30)
    assert codes == [1, 0], [p.stdout.read() if p.stdout else "" for p in nodes]
    report = json.loads(out.read_text())
    findings = [f for s in report["sections"] for f in s["findings"]
                if f["status"] in ("WARN", "FAIL")]
    assert [(f["check"], f["subject"].split(" (")[0]) for f in findings] == [
        ("hang.rank.user_code", "rank 2 on node 1")]
    assert "stuck_in_user_code at " in findings[0]["message"]
    assert "hang_jobs.py:" in findings[0]["message"]
    ranks = report["sections"][0]["data"]["ranks"]
    assert [(r["rank"], r["pid"]) for r in ranks] == list(enumerate(job.pids))
    assert not (tmp_path / "unused.json").exists()
