"""The comm arithmetic and verdicts, without processes."""

from __future__ import annotations

import pytest

from gpucheck.comm.collectives import default_max_bytes, sweep_sizes
from gpucheck.comm.pairwise import pair_schedule
from gpucheck.comm.records import PairRow
from gpucheck.comm.verdicts import (
    baseline_findings,
    correctness_findings,
    pair_findings,
    pair_matrix,
    size_result,
)
from gpucheck.distributed.nodes import NodeId, group_by_node, node_metric, slow_node_findings
from gpucheck.report import Status


def test_size_result_reports_the_slowest_rank_not_the_average() -> None:
    result = size_result("all_reduce", 1_000_000, 250_000, 3, [0.001, 0.004, 0.001], [0, 2, 0])
    assert result.slowest_rank == 1
    assert result.time_us == pytest.approx(4000)
    assert result.algbw_gbps == pytest.approx(0.25)
    assert result.wrong == 2


def test_sweep_sizes_are_powers_of_two_up_to_the_bound() -> None:
    assert sweep_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert sweep_sizes(1024, 5000) == [1024, 2048, 4096, 5000]


def test_default_max_bytes_leaves_room_for_all_gather_output() -> None:
    assert default_max_bytes("cuda", 8, free_bytes=80 << 30) == 1 << 30
    assert default_max_bytes("cuda", 8, free_bytes=1 << 30) <= (1 << 30) // 20
    assert default_max_bytes("cpu", 2, free_bytes=64 << 30) == 16 << 20


def test_wrong_elements_are_a_fail() -> None:
    rows = [{"size_bytes": 1024, "wrong": 0}, {"size_bytes": 2048, "wrong": 3}]
    findings = correctness_findings("all_reduce", rows)
    assert [f.status for f in findings] == [Status.FAIL]
    assert "3 wrong" in findings[0].message


def test_busbw_below_the_baseline_is_a_fail() -> None:
    rows = [{"size_bytes": 1024, "busbw_gbps": 1.0}, {"size_bytes": 1 << 20, "busbw_gbps": 90.0}]
    assert baseline_findings(rows, 100.0)[0].status is Status.FAIL
    assert baseline_findings(rows, 80.0)[0].status is Status.OK
    assert baseline_findings(rows, None) == []


def test_a_slow_pair_is_a_warn_naming_both_gpus() -> None:
    pairs = [PairRow(s, d, 0, 1024, 20.0 if (s, d) == (1, 0) else 100.0)
             for s in range(3) for d in range(3) if s != d]
    names = {r: f"rank {r} (GPU {r})" for r in range(3)}
    findings = pair_findings(pairs, 0.5, names)
    assert [f.status for f in findings] == [Status.WARN]
    assert "rank 1 (GPU 1) -> rank 0 (GPU 0)" in findings[0].message
    matrix = pair_matrix(pairs, [0, 1, 2])
    assert matrix[1]["to 0"] == 20.0 and matrix[0]["to 0"] is None


def test_pairs_stay_within_a_node_and_nodes_run_side_by_side() -> None:
    roster = [{"rank": r, "node_rank": r // 2, "host": f"h{r // 2}"} for r in range(4)]
    steps = pair_schedule(roster)
    assert steps == [[(0, 1), (2, 3)], [(1, 0), (3, 2)]]


def test_nodes_group_by_node_rank_even_on_one_host() -> None:
    roster = [{"rank": r, "node_rank": r % 2, "host": "same"} for r in range(4)]
    groups = group_by_node(roster)
    assert groups == {NodeId(0, "same"): [0, 2], NodeId(1, "same"): [1, 3]}
    metric = node_metric(roster, {0: 10.0, 1: 5.0, 2: 10.0, 3: 5.0}, combine=sum)
    assert metric == {NodeId(0, "same"): 20.0, NodeId(1, "same"): 10.0}
    assert slow_node_findings({NodeId(0, "a"): 1.0}, "x", "y", "z") == []  # one node


def _two_node_result(pair_gbps: dict[tuple[int, int], float]) -> dict:  # type: ignore[type-arg]
    """A comm result of 2 nodes x 3 ranks with the given send/recv bandwidths."""
    ranks = [{"rank": r, "local_rank": r % 3, "node_rank": r // 3, "host": f"h{r // 3}",
              "device": "cpu", "pid": 100 + r} for r in range(6)]
    pairs = [{"src": s, "dst": d, "node_rank": s // 3, "size_bytes": 1024,
              "bandwidth_gbps": gbps} for (s, d), gbps in sorted(pair_gbps.items())]
    return {"world_size": 6, "device": "cpu", "backend": "gloo", "iters": 1, "warmup": 0,
            "sizes_bytes": [1024], "ranks": ranks, "complete": True,
            "collectives": {"all_reduce": []},
            "pairwise": {"size_bytes": 1024, "iters": 1, "pairs": pairs}}


def test_a_nodes_pair_bandwidth_is_the_median_of_all_its_pairs() -> None:
    from gpucheck.comm.report import Verdicts, comm_sections

    # Node 0's six pairs: three at 10 GB/s, then 90, 100, 100. The last pair of each
    # source rank (0->2, 1->2, 2->1) are the fast ones, so a median over those alone
    # reads 100; the median over all six is 50. Node 1 is a uniform 60.
    gbps = {(0, 1): 10.0, (0, 2): 100.0, (1, 0): 10.0, (1, 2): 100.0, (2, 0): 10.0,
            (2, 1): 90.0}
    gbps |= {(s, d): 60.0 for s in range(3, 6) for d in range(3, 6) if s != d}
    sections = {s.name: s for s in comm_sections(_two_node_result(gbps),
                                                 Verdicts(0.5, None, 0.9))}
    rows = sections["nodes"].data["nodes"]
    assert [row["pair_median_gbps"] for row in rows] == [50.0, 60.0]  # type: ignore[index]
    # 50 and 60 are within 0.9 of their median 55: no node is slow.
    assert [f.status for f in sections["nodes"].findings] == [Status.OK]
