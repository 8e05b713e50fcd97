"""The straggler verdict on the per-rank records of real runs (tests/data/stragglers):
a rank stopped from outside in long stretches leaves most iterations untouched, yet
costs the job its whole loop; it is named by what it cost (issue 21)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpucheck.bench.aggregate import RankRecord, aggregate
from gpucheck.bench.pace import HOST_STALL, straggler_kind
from gpucheck.bench.stragglers import straggler_findings
from gpucheck.report import Status

DATA = Path(__file__).resolve().parent / "data" / "stragglers"


def recorded(name: str) -> tuple[RankRecord, ...]:
    raw = json.loads((DATA / f"{name}.json").read_text())
    return tuple(RankRecord(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in row.items()}) for row in raw)


def named(records: tuple[RankRecord, ...]) -> dict[str | None, str | None]:
    """{subject: action} of the straggler WARNs."""
    return {f.subject: f.action for f in straggler_findings(records, aggregate(records))
            if f.status is Status.WARN}


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


def test_a_coarse_stall_that_leaves_the_median_iteration_untouched_is_named() -> None:
    # Rank 0's typical iteration was no slower than rank 1's (its median wall ratio
    # 0.88): the median-of-iterations rule said OK, while the job waited for its loop.
    records = recorded("004-coarse-1.3x-r0")
    summary = aggregate(records)
    pace = next(p for p in summary.paces if p.rank == 0)
    assert pace.wall_vs_others < 1 + summary.threshold
    assert pace.vs_others < 1 + summary.threshold
    assert pace.hold_back > 1 + summary.threshold
    assert pace.waited_ms > 0
    assert summary.stragglers == (0,)


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
