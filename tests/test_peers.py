"""The one peer rule, its elimination and second look, the shared statistics and the
SDC majority vote: pure functions on recorded and handmade figures (deterministic)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpucheck import agreement, peers, stats
from gpucheck import subject as subj
from gpucheck.measure import Better, Bound, LookState

HIGHER = Bound.fraction(0.9, Better.HIGHER)
LOWER = Bound.fraction(0.9, Better.LOWER)
PAIRS = Bound.fraction(0.5, Better.HIGHER)


# --- stats ---

def test_percentile_is_nearest_rank_so_always_a_measured_value() -> None:
    assert stats.percentile([3.0, 1.0], 50) == 1.0
    assert stats.percentile([float(i) for i in range(1, 51)], 99) == 50.0
    assert stats.percentile([5.0], 0) == 5.0


def test_best_typical_and_spread_of_repeated_readings() -> None:
    assert (stats.best([2.0, 9.0, 4.0]), stats.typical([2.0, 9.0, 4.0])) == (9.0, 4.0)
    spread = stats.describe([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (spread.n, spread.median, spread.mad, spread.low, spread.high) == (
        5, 3.0, 1.0, 1.0, 100.0)
    assert stats.significant(0.000123456789) == 0.000123457


# --- against_median ---

# Recorded: GEMM TFLOPS of an 8-GPU H100 node with one GPU held at a lower power
# limit (stress's peer rule at 0.9); the others agree within 2%.
H100_TFLOPS = {0: 702.1, 1: 698.4, 2: 705.3, 3: 611.0, 4: 699.9, 5: 701.2, 6: 703.8,
               7: 697.5}


def test_a_gpu_below_the_fraction_of_its_node_median_is_worse_and_the_rest_are_not() -> None:
    found = peers.against_median(H100_TFLOPS, HIGHER)
    assert found.worse == (3,)
    assert found.reference == pytest.approx(700.55)
    assert found.ratios[3] == pytest.approx(611.0 / 700.55)


def test_a_healthy_node_has_nobody_worse() -> None:
    healthy = {r: v for r, v in H100_TFLOPS.items() if r != 3}
    assert peers.against_median(healthy, HIGHER).worse == ()


def test_for_a_time_the_slow_member_is_the_one_above_the_median_over_the_fraction() -> None:
    times_ms = {0: 10.0, 1: 10.2, 2: 9.9, 3: 11.5}
    assert peers.against_median(times_ms, LOWER).worse == (3,)
    assert peers.against_median({0: 10.0, 1: 10.0, 2: 1.0}, LOWER).worse == ()  # fast: fine


def test_too_few_members_or_a_median_of_zero_name_nobody() -> None:
    assert peers.against_median({0: 1.0}, HIGHER).worse == ()
    assert peers.against_median({0: 1.0, 1: 50.0}, HIGHER, min_count=3).worse == ()
    assert peers.against_median({0: 0.0, 1: 0.0, 2: 5.0}, HIGHER).worse == ()
    assert peers.against_median({}, HIGHER).reference == 0.0


def test_the_known_good_member_is_the_one_closest_to_the_median_of_the_good() -> None:
    nodes = {0: 10.0, 1: 9.5, 2: 3.0, 3: 10.4}
    assert peers.known_good(nodes, [2]) == 0
    assert peers.known_good(nodes, [0, 1, 2, 3]) is None
    assert peers.known_good({5: 1.0, 6: 3.0}, [], reference=2.0) == 5  # a tie: the first


def test_a_slow_node_is_named_and_a_node_exactly_at_the_bound_is_not() -> None:
    from gpucheck.distributed.nodes import NodeId, slow_node_findings

    # A figure per node of a 4-node run; node 3 at 0.78x.
    metric = {NodeId(0, "a"): 2410.0, NodeId(1, "b"): 2395.0, NodeId(2, "c"): 2402.0,
              NodeId(3, "d"): 1874.0}
    (slow,) = slow_node_findings(metric, "comm.nodes.slow_node", "images/s", "img/s")
    assert (slow.status.value, slow.subject.label, slow.action) == ("WARN", "node 3 (d)", "rerun")
    # 90.0 against a median of 100: `value < 0.9 x median` called it slow (0.9 x 100 is
    # 90.00000000000001 in floating point); value / median == 0.9 is at the bound.
    tie = {NodeId(0, "a"): 100.0, NodeId(1, "b"): 100.0, NodeId(2, "c"): 90.0}
    assert [f.status.value for f in slow_node_findings(tie, "comm.nodes.slow_node", "x",
                                                       "u")] == ["OK"]
    times = {NodeId(0, "a"): 1.0, NodeId(1, "b"): 2.0, NodeId(2, "c"): 1.0}
    (late,) = slow_node_findings(times, "comm.nodes.slow_node", "time", "s",
                                 higher_is_better=False)
    assert late.subject.label == "node 1 (b)"


# --- eliminate (the rules of comm's send/recv pairs and stress's peer copies) ---

def _all(members: int, gbps: float = 10.0) -> dict[tuple[int, int], list[float]]:
    return {(s, d): [gbps, gbps * 0.97, gbps * 1.02] for s in range(members)
            for d in range(members) if s != d}


def _nodes(slow: int | None, factor: float, ways: str = "both",
           count: int = 3) -> dict[tuple[int, int], list[float]]:
    def gbps(a: int, b: int) -> float:
        hit = (ways in ("both", "out") and a == slow) or (ways in ("both", "in") and b == slow)
        return 10.0 * (factor if hit else 1.0)
    return {(a, b): [gbps(a, b)] * 3 for a in range(count) for b in range(count) if a != b}


def test_a_node_whose_every_pair_is_slow_is_found_although_it_dominates_the_median() -> None:
    suspects = peers.eliminate(_nodes(2, 0.4), PAIRS)
    assert suspects.members == {2: "both"}
    assert set(suspects.pairs) == {(2, 0), (2, 1), (0, 2), (1, 2)}
    assert suspects.reference == 10.0
    assert suspects.references == ((0, 1), (1, 0))


def test_a_node_at_0_6x_is_judged_the_same_way_every_time() -> None:
    assert peers.eliminate(_nodes(2, 0.6), PAIRS).empty
    assert peers.eliminate(_nodes(2, 0.6), Bound.fraction(0.7, Better.HIGHER)).members == {
        2: "both"}


def test_a_node_that_only_sends_slowly_is_named_for_sending() -> None:
    assert peers.eliminate(_nodes(1, 0.1, "out", count=4), PAIRS).members == {1: "sending"}


def test_a_pair_below_the_bound_but_within_the_spread_is_noisy_not_slow() -> None:
    samples = _nodes(None, 1.0)
    samples[(0, 1)] = [10.0, 3.0, 10.0]  # a healthy pair that read as low as 3 GB/s
    samples[(2, 0)] = [1.0, 1.0, 1.0]  # resolvably slow
    samples[(2, 1)] = [4.0, 4.0, 4.0]  # below 0.5 x 10, but not below 3
    suspects = peers.eliminate(samples, PAIRS)
    assert (suspects.members, suspects.pairs, suspects.noisy) == ({}, ((2, 0),), ((2, 1),))


def test_two_cpu_ranks_spread_by_scheduling_noise_are_not_slow() -> None:
    # Recorded: three repeats per pair at 64 KiB on a shared VM, a 20x spread.
    suspects = peers.eliminate({(0, 1): [0.151, 0.02, 0.03], (1, 0): [0.534, 0.018, 0.04]},
                               PAIRS)
    assert suspects.empty


def test_eliminate_judges_rates_only() -> None:
    with pytest.raises(ValueError):
        peers.eliminate(_all(2), Bound.fraction(0.5, Better.LOWER))


# --- the second look ---

def test_slow_again_is_confirmed_fine_again_is_unstable_none_is_not_measured() -> None:
    beside = (subj.rank(2),)
    confirmed = peers.second_look(2.0, 2.1, 10.0, beside, PAIRS, "GB/s")
    unstable = peers.second_look(2.0, 9.5, 10.0, beside, PAIRS, "GB/s")
    missing = peers.second_look(2.0, None, 10.0, (), PAIRS, "GB/s", why_not="the run ended")
    assert [x.state for x in (confirmed, unstable, missing)] == [
        LookState.CONFIRMED, LookState.UNSTABLE, LookState.NOT_MEASURED]
    assert (confirmed.again, confirmed.reference, confirmed.against) == (2.1, 10.0, beside)
    assert missing.why_not == "the run ended" and missing.again is None


def test_a_second_figure_without_a_reference_is_not_measured_again() -> None:
    look = peers.second_look(2.0, 2.1, 0.0, (), PAIRS, "GB/s")
    assert look.state is LookState.NOT_MEASURED and look.again is None


def test_the_pair_look_compares_with_the_known_good_pairs_measured_beside_it() -> None:
    samples = _all(3)
    samples[(1, 0)] = [1.0, 1.0, 1.0]
    suspects = peers.eliminate(samples, PAIRS)
    ref = suspects.references[0]
    looks = peers.pair_looks(suspects, samples, {(1, 0): [1.0], ref: [2.5]}, PAIRS, "GB/s",
                             lambda p: subj.pair(*p))
    look = looks[(1, 0)]
    assert (look.state, look.reference, look.first) == (LookState.CONFIRMED, 2.5, 1.0)
    assert [s.position() for s in look.against] == [f"rank{ref[0]}_to_rank{ref[1]}"]
    unstable = peers.pair_looks(suspects, samples, {(1, 0): [9.0], ref: [10.0]}, PAIRS,
                                "GB/s", lambda p: subj.pair(*p))
    assert unstable[(1, 0)].state is LookState.UNSTABLE
    (missing,) = peers.pair_looks(suspects, samples, {}, PAIRS, "GB/s",
                                  lambda p: subj.pair(*p)).values()
    assert (missing.state, missing.reference) == (LookState.NOT_MEASURED, suspects.reference)


def _look(state: LookState, first: float = 2.0) -> peers.SecondLook:
    again = None if state is LookState.NOT_MEASURED else \
        (2.0 if state is LookState.CONFIRMED else 9.0)
    return peers.second_look(first, again, 10.0, (), PAIRS, "GB/s")


def test_a_shared_node_is_confirmed_only_when_every_pair_is() -> None:
    both = peers.combined([_look(LookState.CONFIRMED), _look(LookState.CONFIRMED, 1.0)])
    some = peers.combined([_look(LookState.CONFIRMED), _look(LookState.UNSTABLE)])
    gone = peers.combined([_look(LookState.CONFIRMED), _look(LookState.NOT_MEASURED)])
    assert [x.state for x in (both, some, gone)] == [
        LookState.CONFIRMED, LookState.UNSTABLE, LookState.NOT_MEASURED]
    assert both.first == 1.0 and len(both.parts) == 2
    with pytest.raises(ValueError):
        peers.combined([])


# --- the fleet's outliers ---

def test_below_the_median_by_more_than_the_shortfall_is_an_outlier() -> None:
    spread = stats.describe([100.0, 100.0, 100.0, 85.0])
    bound = Bound.shortfall(0.10, Better.HIGHER)
    assert peers.outlier(85.0, spread, bound, 5)
    assert not peers.outlier(91.0, spread, bound, 5)
    assert not peers.outlier(10.0, stats.describe([10.0, 100.0]), bound, 5)


def test_better_than_the_median_is_never_an_outlier() -> None:
    spread = stats.describe([100.0, 101.0, 99.0, 100.0])
    assert not peers.outlier(300.0, spread, Bound.shortfall(0.1, Better.HIGHER), 5)
    assert not peers.outlier(1.0, spread, Bound.shortfall(0.1, Better.LOWER), 5)
    assert peers.outlier(300.0, spread, Bound.shortfall(0.1, Better.LOWER), 5)


def test_a_tight_fleet_flags_a_node_several_mads_off_but_not_noise() -> None:
    fleet = [100.0 + d for d in (-0.2, -0.1, 0.0, 0.0, 0.1, 0.2, 0.1, -0.1, 0.0)] * 3
    bound = Bound.shortfall(0.10, Better.HIGHER)
    assert peers.outlier(96.0, stats.describe([*fleet, 96.0]), bound, 5)
    assert not peers.outlier(99.0, stats.describe([*fleet, 99.0]), bound, 5)


def test_from_a_median_of_zero_any_worse_value_is_an_outlier() -> None:
    spread = stats.describe([0.0, 0.0, 0.0, 3.0])
    assert peers.outlier(3.0, spread, Bound.shortfall(0.1, Better.LOWER), 5)
    assert peers.shortfall(3.0, 0.0, Better.LOWER) == float("inf")


def test_trimming_removes_both_sides_until_stable() -> None:
    assert peers.trimmed([1.0, 1.0, 1.02, 0.98, 5.0, 0.1], 0.1, 5) == [0.98, 1.0, 1.0, 1.02]


# --- the SDC majority vote (torch-free) ---

def test_a_two_way_split_within_tolerance_is_undecided() -> None:
    verdict = agreement.judge({0: "a", 1: "b"}, {0: 1e-4, 1: 1e-4}, 1e-2)
    assert verdict.wrong == {} and verdict.undecided == (0, 1)


# --- no verdict word left in the measuring code ---

def _strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docs]


@pytest.mark.parametrize("package", ["stress", "bench"])
def test_stress_and_bench_word_no_look_in_their_messages(package: str) -> None:
    root = Path(__file__).resolve().parent.parent / "gpucheck" / package
    words = ("confirmed:", "unstable:", "not measured again")
    found = [(path.name, text) for path in sorted(root.glob("*.py"))
             for text in _strings(path) if any(w in text for w in words)]
    assert found == []


def test_a_figure_at_the_bound_within_float_rounding_is_not_worse() -> None:
    # 8.1 / 9 rounds to 0.8999999999999999: at a 0.9 bound that is a tie, not a slow node.
    assert peers.against_median({0: 90.0, 1: 100.0, 2: 100.0}, HIGHER).worse == ()
    assert not Bound.fraction(0.9, Better.HIGHER).worse(8.1, 9.0)
    assert Bound.fraction(0.9, Better.HIGHER).worse(8.0, 9.0)
    assert not Bound.fraction(0.9, Better.LOWER).worse(10.0, 9.0)
