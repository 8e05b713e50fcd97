"""Slow pairs and nodes on handmade figures (GB/s): only what the measurement resolves,
confirmed by a second look. The real gloo runs: test_comm_internode_runs.py and
test_comm_collectives.py."""

from __future__ import annotations

from typing import Any

from gpucheck.comm.internode import exchanges_for
from gpucheck.comm.internode_verdicts import internode_findings
from gpucheck.comm.pairwise import second_look_steps
from gpucheck.comm.records import LinkRow, PairRow
from gpucheck.comm.verdicts import pair_findings, rank_pair, rate_bound
from gpucheck.measure import LookState
from gpucheck.peers import Suspects, eliminate, pair_looks
from gpucheck.report import Status

NAMES = {r: f"rank {r} (cpu)" for r in range(4)}
LABELS = {n: f"node {n} (h{n})" for n in range(4)}


def _pairs(samples: dict[tuple[int, int], list[float]]) -> list[PairRow]:
    return [PairRow(s, d, 0, 65536, sorted(v)[len(v) // 2], tuple(v))
            for (s, d), v in sorted(samples.items())]


def _all(ranks: int, gbps: float = 10.0) -> dict[tuple[int, int], list[float]]:
    return {(s, d): [gbps, gbps * 0.97, gbps * 1.02] for s in range(ranks)
            for d in range(ranks) if s != d}


def find_suspects(samples: dict[tuple[int, int], list[float]], threshold: float) -> Suspects:
    return eliminate(samples, rate_bound(threshold))


def _statuses(findings: list[Any]) -> list[tuple[str, Status]]:
    return [(f.check, f.status) for f in findings]


def test_two_healthy_cpu_ranks_spread_by_noise_raise_no_alarm() -> None:
    # Three repeats per pair as read on this VM at 64 KiB (gpucheck all's CPU size):
    # a 20x spread from scheduling alone. The old rule WARNed on 0.151 against 0.534.
    pairs = _pairs({(0, 1): [0.151, 0.02, 0.03], (1, 0): [0.534, 0.018, 0.04]})
    findings = pair_findings(pairs, 0.5, NAMES, again=[], device="cpu")
    assert Status.WARN not in [f.status for f in findings]
    assert _statuses(findings)[0] == ("comm.pairwise.slow_pair", Status.OK)


def test_one_slow_batch_of_three_is_noise_and_raises_no_alarm() -> None:
    # What a 50 ms stall in one repeat of 0 -> 1 leaves: one sample far below, the
    # other two as healthy as every other pair's (a pair is judged by its median).
    samples = _all(3)
    samples[(0, 1)] = [0.001, 9.9, 10.1]
    findings = pair_findings(_pairs(samples), 0.5, NAMES, again=[], device="cpu")
    assert _statuses(findings) == [("comm.pairwise.slow_pair", Status.OK)]


def test_a_pair_below_the_threshold_but_within_the_spread_is_too_noisy_to_judge() -> None:
    samples = _all(3)
    samples[(0, 1)] = [9.0, 9.5, 3.0]  # a healthy pair that read as low as 3 GB/s
    samples[(2, 0)] = [4.5, 4.0, 4.2]  # below 0.5 x 10, but not below 3.0
    findings = pair_findings(_pairs(samples), 0.5, NAMES, again=[], device="cpu")
    assert _statuses(findings) == [("comm.pairwise.slow_pair", Status.OK),
                                   ("comm.pairwise.slow_pair", Status.SKIP)]
    assert "too noisy to judge" in findings[1].message
    assert "rank 2 (cpu) -> rank 0 (cpu)" in findings[1].message


def test_a_pair_slow_in_most_repeats_is_named_though_its_best_repeat_is_healthy() -> None:
    """Issue 36 item 5: 0 -> 2 read 0.70, 1.56, 0.51 GB/s beside pairs at about 1.5
    (the same shape here at 10 GB/s): judged by its best repeat it passed; by its
    median it is slow, and its repeats disagree widely: intermittent."""
    samples = _all(3)
    samples[(0, 2)] = [4.5, 10.0, 3.3]
    suspects = find_suspects(samples, 0.5)
    assert (suspects.pairs, suspects.intermittent) == (((0, 2),), ((0, 2),))
    (found,) = pair_findings(_pairs(samples), 0.5, NAMES, device="cuda")
    assert (found.status, found.subject.label, found.action) == (Status.WARN, "rank 0 -> rank 2",
                                                           "rerun")
    assert found.look is not None and found.look.first == 4.5  # its median, not 10.0
    steady = {**_all(3), (0, 2): [4.5, 4.4, 3.3]}
    assert find_suspects(steady, 0.5).intermittent == ()  # slow in every repeat


def _slow_one(first: float, again: float, device: str = "cuda") -> list[Any]:
    samples = _all(3)
    samples[(1, 0)] = [first, first, first]
    suspects = find_suspects(samples, 0.5)
    assert suspects.pairs == ((1, 0),) and suspects.references
    measured = {p: [10.0, 9.8, 10.1] for p in suspects.references} | {
        (1, 0): [again, again, again]}
    return pair_findings(_pairs(samples), 0.5, NAMES, again=_pairs(measured), device=device)


def test_a_slow_pair_slow_again_is_confirmed_against_a_known_good_pair() -> None:
    (finding,) = _slow_one(first=2.0, again=2.1)
    assert (finding.status, finding.subject.label) == (Status.WARN, "rank 1 -> rank 0")
    assert (finding.subject.rank, finding.subject.peer) == (1, 0)
    look = finding.look
    assert look is not None and look.state is LookState.CONFIRMED
    assert (look.first, look.again, look.unit) == (2.0, 2.1, "GB/s")
    assert [a.position() for a in look.against] == ["rank0_to_rank1"]
    assert finding.cause is None and finding.hint is not None
    assert "nvidia-smi topo" in finding.hint
    # Slow twice, beside a known-good pair: a link to look into (docs/comm.md).
    assert finding.action == "drain-node"


def test_cpu_ranks_get_a_hint_about_processes_not_gpu_topology() -> None:
    samples = _all(3)
    samples[(1, 0)] = [1.0, 1.0, 1.0]
    (finding,) = pair_findings(_pairs(samples), 0.5, NAMES, device="cpu")
    assert finding.look is not None and finding.look.state is LookState.NOT_MEASURED
    assert finding.look.why_not == "the run ended first" and finding.cause == "cpu_ranks"
    assert finding.hint is not None and "nvidia-smi" not in finding.hint


def _nodes(slow: int | None, factor: float, ways: str = "both",
           nodes: int = 3) -> dict[tuple[int, int], list[float]]:
    def gbps(a: int, b: int) -> float:
        hit = (ways in ("both", "out") and a == slow) or (ways in ("both", "in") and b == slow)
        return 10.0 * (factor if hit else 1.0)
    return {(a, b): [gbps(a, b)] * 3 for a in range(nodes) for b in range(nodes) if a != b}


def test_a_node_whose_every_pair_is_slow_is_found_although_it_dominates_the_median() -> None:
    # Three nodes, node 2 at 0.4x both ways: 4 of the 6 pairs are its own, so the
    # median of all pairs is 4 GB/s and nothing is below 0.5 x that. Elimination
    # compares node 2's pairs with the pairs without it (10 GB/s).
    suspects = find_suspects(_nodes(2, 0.4), 0.5)
    assert suspects.members == {2: "both"}
    assert set(suspects.pairs) == {(2, 0), (2, 1), (0, 2), (1, 2)}
    assert suspects.reference == 10.0
    assert exchanges_for(suspects) == [(0, 1), (0, 2), (1, 2)]


def test_a_node_at_0_6x_is_judged_the_same_way_every_time() -> None:
    assert find_suspects(_nodes(2, 0.6), 0.5).empty  # within the threshold: always OK
    assert find_suspects(_nodes(2, 0.6), 0.7).members == {2: "both"}  # always named


def test_a_node_that_only_sends_slowly_is_named_for_sending() -> None:
    assert find_suspects(_nodes(1, 0.1, "out", nodes=4), 0.5).members == {1: "sending"}


def _rows(samples: dict[tuple[int, int], list[float]]) -> list[dict[str, Any]]:
    return [{"src_node": a, "dst_node": b, "round": 1, "rails": 1, "bandwidth_gbps": v[0],
             "samples_gbps": v, "rail": 0} for (a, b), v in sorted(samples.items())]


def _node_findings(again_factor: float) -> list[Any]:
    again = [LinkRow("again", a, b, 0, a, b, v[0], tuple(v))
             for (a, b), v in _nodes(2, again_factor).items()]
    return internode_findings(_rows(_nodes(2, 0.1)), 0.5, LABELS, again=again)


def test_a_slow_node_slow_again_is_confirmed_against_known_good_nodes() -> None:
    findings = _node_findings(0.1)
    (node,) = [f for f in findings if f.check == "comm.internode.shared_node"]
    assert node.subject.label == "node 2 (h2)" and node.subject.node == 2
    assert node.look is not None and node.look.state is LookState.CONFIRMED
    # One look per slow pair of the node, each beside the known-good pairs 0 <-> 1.
    assert len(node.look.parts) == 4
    assert {a.position() for a in node.look.against} == {"node0_to_node1", "node1_to_node0"}
    assert node.action == "drain-node"
    slow = [f for f in findings if f.check == "comm.internode.slow_pair"]
    assert {f.subject.label for f in slow} == {"node 2 -> node 0", "node 2 -> node 1",
                                         "node 0 -> node 2", "node 1 -> node 2"}
    assert all(f.look is not None and f.look.state is LookState.CONFIRMED
               and f.action == "drain-node" for f in slow)


def test_the_second_look_compares_with_the_known_good_pairs_measured_beside_it() -> None:
    samples = _all(3)
    samples[(1, 0)] = [1.0, 1.0, 1.0]
    suspects = find_suspects(samples, 0.5)
    again = {(1, 0): [1.0], suspects.references[0]: [2.5]}
    (look,) = pair_looks(suspects, samples, again, rate_bound(0.5), "GB/s",
                         rank_pair).values()
    assert look.reference == 2.5 and look.state is LookState.CONFIRMED
    (missing,) = pair_looks(suspects, samples, {}, rate_bound(0.5), "GB/s",
                            rank_pair).values()
    assert missing.state is LookState.NOT_MEASURED


def test_each_node_measures_its_reference_and_its_slow_pairs_again_side_by_side() -> None:
    samples = _all(3)
    samples[(1, 0)] = [1.0, 1.0, 1.0]
    plan = find_suspects(samples, 0.5)
    steps = second_look_steps({(0, ""): plan})
    assert [p for step in steps for p in step] == [*plan.references, (1, 0)]


def test_a_node_is_no_suspect_when_one_of_its_slow_pairs_is_within_the_noise() -> None:
    samples = _nodes(None, 1.0)
    samples[(0, 1)] = [10.0, 3.0, 10.0]  # a healthy pair that read as low as 3 GB/s
    samples[(2, 0)] = [1.0, 1.0, 1.0]  # resolvably slow
    samples[(2, 1)] = [4.0, 4.0, 4.0]  # below 0.5 x 10, but not below 3
    suspects = find_suspects(samples, 0.5)
    assert (suspects.members, suspects.pairs, suspects.noisy) == ({}, ((2, 0),), ((2, 1),))
