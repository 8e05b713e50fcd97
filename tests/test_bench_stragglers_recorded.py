"""The straggler verdict on the per-rank records of real runs (tests/data/stragglers):
a rank stopped from outside in long stretches leaves most iterations untouched, yet
costs the job its whole loop; it is named by what it cost (issue 21)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpucheck.bench.pace import HOST_STALL, aggregate, look_again, straggler_kind
from gpucheck.bench.records import RankRecord
from gpucheck.bench.stragglers import straggler_findings
from gpucheck.measure import LookState
from gpucheck.report import Finding, Status

DATA = Path(__file__).resolve().parent / "data" / "stragglers"


def recorded(name: str) -> tuple[RankRecord, ...]:
    raw = json.loads((DATA / f"{name}.json").read_text())
    return tuple(RankRecord(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in row.items()}) for row in raw)


def named(records: tuple[RankRecord, ...]) -> dict[str | None, str | None]:
    """{subject: action} of the straggler WARNs."""
    return {f.subject and f.subject.label: f.action
            for f in straggler_findings(records, aggregate(records)) if f.status is Status.WARN}


# 040 and 065: a rank whose median iteration read 1.15x (device) or whose wall clock
# read slow while its whole loop kept pace (hold-back 1.05 and below): named before the
# verdict became what the rank cost the job.
@pytest.mark.parametrize("name", ["000-healthy", "005-healthy", "040-healthy", "065-healthy"])
def test_recorded_healthy_runs_name_no_straggler(name: str) -> None:
    assert named(recorded(name)) == {}


# 083: the healthy rank 0 computed 1.10x slower in its median iteration beside the
# stopped rank 1 (cache and scheduler effects) and was named a slow device beside it.
@pytest.mark.parametrize("name, rank", [("001-fine-2x-r1", 1), ("003-coarse-2x-r1", 1),
                                        ("083-coarse-2x-r1", 1),
                                        ("004-coarse-1.3x-r0", 0), ("026-fine-2x-r0", 0)])
def test_a_rank_stopped_from_outside_is_named_alone_as_held_back_by_its_host(
        name: str, rank: int) -> None:
    records = recorded(name)
    assert named(records) == {f"rank {rank}": "fix-config"}
    summary = aggregate(records)
    pace = next(p for p in summary.paces if p.rank == rank)
    assert straggler_kind(pace, summary.threshold) == HOST_STALL


def test_one_long_stop_in_a_recorded_healthy_run_is_a_hiccup_not_a_straggler() -> None:
    # The same healthy run with rank 1 stopped once for 1.5 s in one iteration: the job
    # waited for it once, which is no persistent straggler.
    zero, one = recorded("005-healthy")
    walls = list(one.iter_wall_ms)
    walls[6] += 1500.0
    ends = tuple(e + (1500.0 if i >= 6 else 0.0) for i, e in enumerate(one.iter_end_ms))
    stalled = replace(one, iter_wall_ms=tuple(walls), iter_end_ms=ends,
                      wall_s=one.wall_s + 1.5, span_s=one.span_s + 1.5)
    records = (replace(zero, span_s=zero.span_s + 1.5), stalled)
    assert aggregate(records).stragglers == ()
    assert named(records) == {}


def test_a_stopped_rank_whose_cpu_time_grew_a_little_is_still_its_hosts_fault() -> None:
    # Stopped half the time, rank 0 came back to cold caches: 1.14x the CPU time per
    # iteration (above the threshold), 1.87x the loop. The CPU time explains a fraction
    # of what it cost the job: its host is what to fix, not its CPU.
    records = recorded("026-fine-2x-r0")
    summary = aggregate(records)
    pace = next(p for p in summary.paces if p.rank == 0)
    assert pace.vs_others > 1 + summary.threshold and pace.hold_back > 1.5
    assert straggler_kind(pace, summary.threshold) == HOST_STALL


# A suspect's whole loop held the job back: in these by one stall alone (a 138 ms stop
# in a 0.9 s loop, and one healthy run's hiccup), in the planted runs by many. None is
# named on one loop: the ranks run it again and it is judged over both (issue 21: 13
# of 20 coarse 1.3x stalls were named before the second look; under load, 2 of 20
# healthy runs were).
ONE_STALL = ["094-coarse-1.3x-r0", "079-coarse-1.3x-r1", "045-healthy"]


@pytest.mark.parametrize("name", [*ONE_STALL, "004-coarse-1.3x-r0", "001-fine-2x-r1"])
def test_a_loop_that_held_the_job_back_is_run_again(name: str) -> None:
    records = recorded(name)
    assert look_again(records, 0.1)
    assert not look_again(again(records, {0: 1.0, 1: 1.0}), 0.1)  # once only


@pytest.mark.parametrize("name", ONE_STALL)
def test_one_stall_alone_names_no_straggler_on_one_loop(name: str) -> None:
    assert named(recorded(name)) == {}


@pytest.mark.parametrize("name", ["000-healthy", "005-healthy", "040-healthy"])
def test_a_loop_that_kept_pace_is_not_run_again(name: str) -> None:
    assert not look_again(recorded(name), 0.1)


def again(records: tuple[RankRecord, ...], walls: dict[int, float]) -> tuple[RankRecord, ...]:
    """The records with each rank's second-look loop (seconds)."""
    return tuple(replace(r, again_wall_s=walls[r.rank]) for r in records)


def _straggler(records: tuple[RankRecord, ...]) -> list[Finding]:
    return straggler_findings(records, aggregate(records))


def test_a_stall_that_recurs_in_the_second_loop_is_named_with_its_look_confirmed() -> None:
    records = again(recorded("094-coarse-1.3x-r0"), {0: 1.15, 1: 1.0})
    (warned,) = [f for f in _straggler(records) if f.status is Status.WARN]
    assert (warned.subject.label, warned.action, warned.cause) == ("rank 0", "fix-config",
                                                             "host_stall")
    look = warned.look
    assert look is not None and look.state is LookState.CONFIRMED
    assert look.first == pytest.approx(1.119, abs=1e-3) and look.again == pytest.approx(1.15)
    assert look.unit == "x" and look.bound.limit == pytest.approx(1.1)


@pytest.mark.parametrize("name", ONE_STALL)
def test_a_stall_not_seen_in_the_second_loop_is_an_ok_that_keeps_its_look(name: str) -> None:
    records = again(recorded(name), {0: 1.0, 1: 1.02})
    found = _straggler(records)
    assert all(f.status is Status.OK for f in found)
    (cleared,) = [f for f in found if f.look is not None]
    assert cleared.look is not None and cleared.look.state is LookState.UNSTABLE
    stalled = max(aggregate(records).paces, key=lambda p: p.whole)
    assert cleared.subject.label == f"rank {stalled.rank}"
    assert stalled.both is not None and stalled.both <= 1.1


@pytest.mark.parametrize("name, rank", [("001-fine-2x-r1", 1), ("004-coarse-1.3x-r0", 0)])
def test_a_straggler_slow_again_is_confirmed_over_both_loops(name: str, rank: int) -> None:
    records = recorded(name)
    walls = {r.rank: r.wall_s for r in records}  # the second loop as slow as the first
    found = _straggler(again(records, walls))
    (warned,) = [f for f in found if f.status is Status.WARN]
    assert warned.subject.label == f"rank {rank}" and warned.look is not None
    assert warned.look.state is LookState.CONFIRMED


def test_records_without_a_second_look_name_no_straggler_on_one_stall() -> None:
    (_, cleared) = _straggler(recorded("094-coarse-1.3x-r0"))
    assert cleared.status is Status.OK and cleared.look is not None
    assert cleared.look.state is LookState.NOT_MEASURED and cleared.look.again is None
