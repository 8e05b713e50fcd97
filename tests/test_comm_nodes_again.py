"""comm.nodes.slow_node: a slow node is measured again beside a known-good node before
it is condemned. Pure functions on handmade figures; the real run (two "nodes" of two
gloo ranks, node 1's pairs slowed) is in test_comm_internode_runs.py."""

from __future__ import annotations

from typing import Any

from gpucheck.comm.verdicts import node_figures, plan, slow_node_verdicts
from gpucheck.measure import Better, LookState
from gpucheck.report import Status

RANKS = [{"rank": r, "node_rank": r // 2, "host": f"h{r // 2}"} for r in range(6)]


def _pairs(gbps: dict[int, float]) -> list[dict[str, Any]]:
    """Both pairs of each node (ranks 2n and 2n+1) at that node's figure."""
    return [{"src": s, "dst": d, "bandwidth_gbps": gbps[s // 2]}
            for s in range(6) for d in range(6) if s != d and s // 2 == d // 2]


FIRST = {0: 10.0, 1: 10.2, 2: 2.0}  # node 2 at a fifth of the others


def _verdicts(again: dict[int, float] | None, device: str = "cuda") -> list[Any]:
    figures = node_figures(RANKS, _pairs(FIRST), [])
    wanted = plan(figures, 0.9)
    second = None if again is None else (wanted or {}) | {"pairs": [
        p for p in _pairs(again | {n: 0.0 for n in FIRST if n not in again})
        if p["src"] // 2 in again]}
    return slow_node_verdicts(figures, 0.9, second, RANKS, device)


def test_healthy_nodes_are_not_measured_again_and_stay_ok() -> None:
    figures = node_figures(RANKS, _pairs({0: 10.0, 1: 10.2, 2: 9.8}), [])
    assert plan(figures, 0.9) is None
    assert [f.status for f in slow_node_verdicts(figures, 0.9, None, RANKS)] == [Status.OK]


def test_a_slow_node_is_measured_again_beside_the_known_good_node_nearest_the_median(
        ) -> None:
    wanted = plan(node_figures(RANKS, _pairs(FIRST), []), 0.9)
    assert wanted == {"kind": "pairs", "suspects": [2], "known_good": 0}


def test_a_node_slow_again_is_confirmed_against_the_known_good_node_and_drained() -> None:
    (found,) = _verdicts({2: 2.1, 0: 9.9})
    assert (found.status, found.subject.label, found.action) == (Status.WARN, "node 2 (h2)",
                                                           "drain-node")
    assert (found.subject.node, found.subject.host, found.cause) == (2, "h2", None)
    look = found.look
    assert look is not None and look.state is LookState.CONFIRMED
    assert (look.first, look.again, look.reference, look.unit) == (2.0, 2.1, 9.9, "GB/s")
    assert [a.position() for a in look.against] == ["node0"]


def test_on_cpu_ranks_a_node_slow_again_is_a_busy_host_to_rerun() -> None:
    (found,) = _verdicts({2: 2.1, 0: 9.9}, device="cpu")
    assert found.look is not None and found.look.state is LookState.CONFIRMED
    assert (found.cause, found.action) == ("cpu_ranks", "rerun")


def test_a_node_fine_the_second_time_is_an_ok_keeping_its_unstable_look() -> None:
    (found,) = _verdicts({2: 9.7, 0: 9.9})
    assert (found.subject.label, found.status, found.action) == ("node 2 (h2)", Status.OK, None)
    assert found.look is not None and found.look.state is LookState.UNSTABLE
    assert found.look.again == 9.7


def test_a_slow_node_not_measured_again_says_so_and_is_not_condemned() -> None:
    (found,) = _verdicts(None)
    assert found.look is not None and found.look.state is LookState.NOT_MEASURED
    assert found.action == "rerun"


def test_one_rank_per_node_is_judged_by_the_largest_all_reduce_time_again() -> None:
    ranks = [{"rank": r, "node_rank": r, "host": f"h{r}"} for r in range(3)]
    rows = [{"rank_times_us": [100.0, 101.0, 400.0]}]
    figures = node_figures(ranks, [], rows)
    wanted = plan(figures, 0.9)
    assert wanted == {"kind": "all_reduce", "suspects": [2], "known_good": 1}
    slow = (wanted or {}) | {"rank_times_us": [100.0, 99.0, 390.0]}
    (found,) = slow_node_verdicts(figures, 0.9, slow, ranks)
    assert found.subject.label == "node 2 (h2)" and found.action == "drain-node"
    look = found.look
    assert look is not None and look.state is LookState.CONFIRMED
    # Times: lower is better, worse above the known-good node's time / 0.9.
    assert (look.unit, look.bound.better, look.again, look.reference) == (
        "us", Better.LOWER, 390.0, 99.0)
    fine = (wanted or {}) | {"rank_times_us": [100.0, 99.0, 101.0]}
    (found,) = slow_node_verdicts(figures, 0.9, fine, ranks)
    assert found.look is not None and found.look.state is LookState.UNSTABLE
    assert (found.status, found.action) == (Status.OK, None)
