"""Two "nodes" on one machine: two torchrun launchers, --nnodes 2, c10d on 127.0.0.1."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from comm_workers import PYTHON, clean_env, free_port, start, tracked, wait_gone

RUN_S = 240


def _two_nodes(tmp_path: Path, *command: str) -> dict[str, Any]:
    """Run `gpucheck COMMAND` under two 1-rank torchrun nodes; return rank 0's report."""
    port, out, run_id = free_port(), tmp_path / "report.json", uuid.uuid4().hex[:8]
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", run_id, "--max-restarts", "0", "-m", "gpucheck", *command,
                "-q", "-o", str(out)]
    procs = [start(torchrun, clean_env()) for _ in range(2)]
    with tracked(procs) as seen:
        outputs = [p.communicate(timeout=RUN_S) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert wait_gone(seen) == []
    return json.loads(out.read_text())


def _rows_with_nodes(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for section in report["sections"]:
        for value in section["data"].values():
            if isinstance(value, list):
                rows += [r for r in value if isinstance(r, dict) and "node_rank" in r]
    return rows


def test_bench_on_two_nodes_reports_ranks_of_both_nodes(tmp_path: Path) -> None:
    report = _two_nodes(tmp_path, "bench", "--model", "mobilenet_v3_small", "--iters", "1",
                        "--warmup", "0", "--batch-size", "1", "--timeout", "60")
    assert {r["node_rank"] for r in _rows_with_nodes(report)} >= {0, 1}


@pytest.mark.filterwarnings("ignore")
def test_env_and_comm_on_two_nodes_compare_the_nodes_and_group_ranks_by_node(
        tmp_path: Path) -> None:
    # One launch: `all` runs env's node comparison, then comm's group, on both nodes.
    report = _two_nodes(tmp_path, "all", "--skip", "stress,bench", "--timeout", "60")
    sections = {s["name"]: s for s in report["sections"]}
    nodes = sections["env.nodes"]
    assert [n["node_rank"] for n in nodes["data"]["nodes"]] == [0, 1]
    # Same machine, same software: no difference may be reported.
    assert [f["status"] for f in nodes["findings"]] == ["OK"], nodes["findings"]
    assert {"env.node0.torch", "env.node1.torch"} <= set(sections)
    assert sections["comm.comm"]["data"]["nodes"] == 2
    comm_nodes = sections["comm.nodes"]
    assert [n["node_rank"] for n in comm_nodes["data"]["nodes"]] == [0, 1]
    assert [f["check"] for f in comm_nodes["findings"]] == ["comm.nodes.slow_node"]
    assert "comm.pairwise" not in sections  # one rank per node: no intra-node pair
