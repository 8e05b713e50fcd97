"""Node-to-node rounds: the schedule, the per-pair table and the verdicts, without processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpucheck.comm.internode import rail_links, round_schedule
from gpucheck.comm.internode_verdicts import (
    internode_findings,
    node_pair_rows,
    rail_exchanges,
    rail_findings,
    shared_node,
)
from gpucheck.comm.records import LinkRow, crossing
from gpucheck.comm.report import Verdicts, comm_sections
from gpucheck.measure import LookState
from gpucheck.report import Status

LABELS = {i: f"node {i} (h{i})" for i in range(5)}


@pytest.mark.parametrize("nodes", [2, 3, 4, 5])
def test_the_schedule_covers_every_ordered_node_pair_once_in_n_minus_1_rounds(
        nodes: int) -> None:
    rounds = round_schedule(nodes)
    assert len(rounds) == nodes - 1
    pairs = [pair for one in rounds for pair in one]
    expected = {(a, b) for a in range(nodes) for b in range(nodes) if a != b}
    assert sorted(pairs) == sorted(expected)


@pytest.mark.parametrize("nodes", [2, 3, 4, 5])
def test_each_node_sends_once_and_receives_once_per_round(nodes: int) -> None:
    for one in round_schedule(nodes):
        assert sorted(src for src, _ in one) == list(range(nodes))
        assert sorted(dst for _, dst in one) == list(range(nodes))
        assert all(src != dst for src, dst in one)


def test_one_node_has_no_round() -> None:
    assert round_schedule(1) == []


def test_rails_pair_local_rank_k_with_local_rank_k_as_far_as_both_nodes_go() -> None:
    nodes = [[0, 1, 2], [3, 4]]
    assert rail_links(nodes, 0, 1) == [(0, 0, 3), (1, 1, 4)]
    assert rail_links(nodes, 1, 0) == [(0, 3, 0), (1, 4, 1)]


def _link(src: int, dst: int, rail: int, gbps: float) -> LinkRow:
    return LinkRow((dst - src) % 3, src, dst, rail, src * 2 + rail, dst * 2 + rail, gbps)


def _links(slow: dict[tuple[int, int], float],
           rails: dict[tuple[int, int, int], float] | None = None) -> list[LinkRow]:
    """Three nodes, two rails each, 10 GB/s per rail unless `slow` (a node pair) or `rails`
    (a node pair's rail) says otherwise."""
    return [_link(a, b, k, (rails or {}).get((a, b, k), slow.get((a, b), 10.0)))
            for a in range(3) for b in range(3) if a != b for k in range(2)]


def test_a_node_pair_is_the_sum_of_its_rails_and_keeps_its_slowest_rail() -> None:
    links = _links({}, {(0, 1, 0): 4.0})
    rows = node_pair_rows(links)
    assert len(rows) == 6
    first = rows[0]
    assert (first["src_node"], first["dst_node"], first["rails"]) == (0, 1, 2)
    assert first["bandwidth_gbps"] == pytest.approx(14.0)
    assert (first["slowest_rail"], first["slowest_rail_gbps"]) == (0, 4.0)


def test_slow_pairs_that_share_a_node_name_that_node() -> None:
    rows = node_pair_rows(_links({(2, 0): 1.0, (2, 1): 1.0}))
    findings = internode_findings(rows, 0.5, LABELS)
    slow = [f for f in findings if f.check == "comm.internode.slow_pair"]
    assert [f.subject.label for f in slow] == ["node 2 -> node 0", "node 2 -> node 1"]
    assert all(f.status == Status.WARN for f in slow)
    (named,) = [f for f in findings if f.check == "comm.internode.shared_node"]
    assert named.status == Status.WARN and named.subject.label == "node 2 (h2)"


def test_one_slow_pair_names_the_pair_but_no_node() -> None:
    findings = internode_findings(node_pair_rows(_links({(0, 1): 1.0})), 0.5, LABELS)
    assert [f.check for f in findings] == ["comm.internode.slow_pair"]
    assert findings[0].status == Status.WARN


def test_the_shared_node_must_be_in_most_slow_pairs_and_more_than_any_other() -> None:
    assert shared_node([(2, 0), (2, 1)]) == 2
    assert shared_node([(0, 1), (1, 0)]) is None  # both ends equally: no suspect
    assert shared_node([(0, 1), (2, 3), (4, 5)]) is None  # no node in two of them
    assert shared_node([(0, 1), (0, 2), (3, 4)]) == 0
    assert shared_node([(0, 1)]) is None


def _result(nodes: int, internode: dict | None) -> dict:  # type: ignore[type-arg]
    ranks = [{"rank": i, "node_rank": i, "host": "h", "device": "cpu", "local_rank": 0}
             for i in range(nodes)]
    return {"world_size": nodes, "device": "cpu", "backend": "gloo", "iters": 1,
            "warmup": 0, "sizes_bytes": [1024], "ranks": ranks, "collectives": {},
            "pairwise": None, "internode": internode, "complete": True, "faults": []}


VERDICTS = Verdicts(0.5, None, 0.9)


def test_the_report_names_node_pairs_by_their_nodes() -> None:
    links = [crossing(_link(0, 1, 0, 5.0)), crossing(_link(1, 0, 0, 5.0))]
    internode = {"size_bytes": 1024, "iters": 1, "links": links}
    sections = {s.name: s for s in comm_sections(_result(2, internode), VERDICTS)}
    data = sections["internode"].data
    assert data["rounds"] == 1
    assert [(r["src"], r["dst"]) for r in data["node_pairs"]] == [
        ("node 0 (h)", "node 1 (h)"), ("node 1 (h)", "node 0 (h)")]


def test_a_slow_rail_is_named_even_when_its_node_pair_sum_is_fine() -> None:
    links = _links({}, {(0, 1, 1): 1.0})
    assert [f.status for f in internode_findings(node_pair_rows(links), 0.5, LABELS)] == [
        Status.OK]
    findings = rail_findings(links, 0.5, LABELS)
    assert [(f.check, f.status, f.subject.label) for f in findings] == [
        ("comm.internode.slow_rail", Status.WARN, "rank 1 -> rank 3")]


def test_a_slow_rail_is_measured_again_with_its_node_pair_and_a_known_good_one() -> None:
    links = _links({})
    assert rail_exchanges(links, 0.5) == []  # healthy: nothing to measure again
    assert rail_exchanges(_links({}, {(0, 1, 1): 1.0}), 0.5) == [(0, 1), (0, 2)]


def test_a_slow_rail_slow_again_is_confirmed_against_the_rail_links_measured_with_it(
        ) -> None:
    links = _links({}, {(0, 1, 1): 1.0})
    again = [replace(x, round="again", bandwidth_gbps=1.1 if x.bandwidth_gbps == 1.0 else 9.8)
             for x in links if tuple(sorted((x.src_node, x.dst_node))) in
             rail_exchanges(links, 0.5)]  # as planned
    (confirmed,) = rail_findings(links, 0.5, LABELS, again)
    assert (confirmed.subject.label, confirmed.action) == ("rank 1 -> rank 3", "drain-node")
    look = confirmed.look
    assert look is not None and look.state is LookState.CONFIRMED
    # Against the 7 known-good rail links measured with it, at their median.
    assert (look.again, look.reference, len(look.against)) == (1.1, 9.8, 7)


def test_with_one_rail_the_node_pairs_say_it_all() -> None:
    links = [x for x in _links({(2, 0): 1.0, (2, 1): 1.0}) if x.rail == 0]
    assert rail_findings(links, 0.5, LABELS) == []
