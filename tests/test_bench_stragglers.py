"""Straggler verdicts from per-iteration times: handcrafted records and runs recorded on
the 2-core development VM (the noisy case the verdict must survive)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gpucheck.bench.findings import rank_rows, straggler_findings
from gpucheck.bench.pace import MIN_JUDGED_ITERS, SLOW_DEVICE, aggregate, straggler_kind
from gpucheck.bench.records import RankRecord
from gpucheck.report import Status
from gpucheck.stats import percentile

# Per-iteration wall-clock ms of real default runs (2 CPU ranks, ResNet50, batch 4, 12
# iterations) on the 2-core VM while other test suites ran (load average 4 to 5).
HEALTHY_RAMP = [  # the load grew during the loop: whole-loop medians differ by 1.14x
    [522, 620, 904, 932, 1230, 1264, 805, 1955, 2239, 2678, 2171, 1116],
    [571, 601, 940, 934, 1403, 1268, 1003, 1556, 1940, 2137, 1459, 1821]]
HEALTHY_NOISY = [  # rank 0's median is 1.16x rank 1's, and above it in 10 of 12 iterations
    [1576, 1131, 1149, 502, 1108, 1032, 974, 1067, 1111, 1192, 1139, 864],
    [1566, 1345, 935, 876, 1305, 877, 1058, 1048, 779, 956, 851, 1079]]
SLOWED = [  # rank 1 slept 15% of its own forward time after every forward
    [874, 1071, 977, 868, 778, 753, 896, 832, 738, 711, 733, 874],
    [992, 1296, 1115, 1086, 865, 921, 957, 925, 954, 1008, 657, 655]]


def ranks(*iter_ms: Sequence[float], host: str = "node0") -> tuple[RankRecord, ...]:
    return tuple(RankRecord(
        rank=rank, host=host, node_rank=0, local_rank=rank, device=f"cuda:{rank}",
        device_name="NVIDIA H100", device_uuid=f"GPU-{rank}", images=len(times) * 128,
        iters=len(times), wall_s=sum(times) / 1e3, span_s=sum(times) / 1e3,
        device_s=sum(times) / 1e3, peak_memory_bytes=None, threads=1,
        iter_ms=tuple(float(t) for t in times),
    ) for rank, times in enumerate(iter_ms))


def noisy(n: int, scale: float = 1.0) -> list[float]:
    """n iterations around 100 ms with a fixed +-8% pattern (no randomness)."""
    return [scale * (100 + 8 * ((i * 7) % 5 - 2) / 2) for i in range(n)]


def warned(records: tuple[RankRecord, ...], **kwargs: float) -> list[str | None]:
    findings = straggler_findings(records, aggregate(records, **kwargs))
    return [f.subject and f.subject.label for f in findings if f.status is Status.WARN]


def test_a_rank_slower_in_every_iteration_is_named() -> None:
    records = ranks(noisy(12), noisy(12, scale=1.15), noisy(12))
    assert warned(records) == ["rank 1"]


def test_with_two_ranks_the_slow_one_is_compared_with_the_other_not_with_both() -> None:
    # Against the median of both ranks, 15% slower would read as only 7%.
    summary = aggregate(ranks(noisy(12), noisy(12, scale=1.15)))
    assert summary.paces[1].vs_others == pytest.approx(1.15)
    assert summary.stragglers == (1,)


def flat(n: int, ms: float = 100.0) -> list[float]:
    return [ms] * n


def test_one_hiccup_does_not_make_a_straggler() -> None:
    hiccup = noisy(12)
    hiccup[9] *= 10  # one iteration stalled for a second: the whole loop is 1.8x
    summary = aggregate(ranks(noisy(12), hiccup))
    assert summary.vs_median[1] / summary.vs_median[0] > 1.5
    assert summary.stragglers == ()


def test_a_slowdown_in_fewer_than_half_of_the_iterations_is_not_a_straggler() -> None:
    records = ranks(flat(24), [100.0 if i % 3 else 130.0 for i in range(24)])
    summary = aggregate(records)
    assert summary.paces[1].slower_share == pytest.approx(1 / 3)
    assert summary.stragglers == ()
    assert [f.status for f in straggler_findings(records, summary)] == [Status.OK]


def test_a_slowdown_in_most_of_the_iterations_is_a_straggler() -> None:
    records = ranks(flat(24), [130.0 if i % 3 else 100.0 for i in range(24)])
    summary = aggregate(records)
    assert summary.paces[1].vs_others == pytest.approx(1.3)
    assert summary.stragglers == (1,)


def test_recorded_healthy_runs_on_the_noisy_vm_are_not_stragglers() -> None:
    for run in (HEALTHY_RAMP, HEALTHY_NOISY):
        medians = sorted(percentile(times, 50) for times in run)
        assert medians[1] / medians[0] > 1.1  # whole-loop medians would have warned
        assert warned(ranks(*run)) == []


def test_a_recorded_run_with_rank_one_slowed_by_15_percent_names_it() -> None:
    summary = aggregate(ranks(*SLOWED))
    assert summary.stragglers == (1,)
    assert summary.paces[1].vs_others > 1.1 and summary.paces[0].vs_others < 0.9


def test_a_rank_three_times_slower_is_named_though_most_of_its_loop_ran_alone() -> None:
    # After the others finished, its iterations are compared with their median one.
    assert warned(ranks(noisy(12), noisy(12, scale=3.0))) == ["rank 1"]


def test_one_straggler_among_eight_ranks_is_the_only_one_named() -> None:
    times = [noisy(20) for _ in range(8)]
    times[5] = noisy(20, scale=1.2)
    assert warned(ranks(*times)) == ["rank 5"]


def test_the_threshold_is_configurable() -> None:
    records = ranks(flat(12), flat(12, 108.0))
    assert warned(records, threshold=0.10) == []
    assert warned(records, threshold=0.05) == ["rank 1"]


def test_too_few_iterations_are_not_judged() -> None:
    few = MIN_JUDGED_ITERS - 1
    records = ranks(noisy(few), noisy(few, scale=2.0))
    summary = aggregate(records)
    assert summary.stragglers == ()
    findings = straggler_findings(records, summary)
    assert [f.status for f in findings] == [Status.SKIP]
    assert "--iters" in findings[0].message


def test_one_rank_has_no_straggler_to_judge() -> None:
    records = ranks(noisy(12))
    findings = straggler_findings(records, aggregate(records))
    assert [f.status for f in findings] == [Status.OK]


def test_the_straggler_warning_names_rank_host_gpu_and_figures() -> None:
    records = ranks(noisy(12), noisy(12, scale=1.3), host="node7")
    [finding] = straggler_findings(records, aggregate(records))
    assert finding.status is Status.WARN and finding.subject.label == "rank 1"
    for part in ("rank 1 on node7", "NVIDIA H100", "GPU-1", "1.30x", "slower in"):
        assert part in finding.message


def test_a_cause_is_appended_to_the_straggler_warning_of_its_rank_only() -> None:
    records = ranks(noisy(12), noisy(12, scale=1.3), noisy(12, scale=1.3), noisy(12))
    causes = {1: "was in HW thermal slowdown 40% of the timed loop", 3: "unrelated"}
    findings = straggler_findings(records, aggregate(records), causes)
    by_subject = {str(f.subject): f.message for f in findings}
    assert by_subject["rank 1"].endswith("; was in HW thermal slowdown 40% of the timed loop")
    assert "thermal" not in by_subject["rank 2"]
    assert "unrelated" not in " ".join(by_subject.values())  # rank 3 is no straggler


def test_the_ranks_table_has_each_ranks_p50_and_p99_in_ms() -> None:
    records = ranks(noisy(12), [*noisy(11), 900.0])
    rows = rank_rows(records, aggregate(records))
    assert [r["p50_ms"] for r in rows] == [percentile(noisy(12), 50)] * 2
    assert rows[1]["p99_ms"] == 900.0 and rows[0]["p99_ms"] == max(noisy(12))
    assert rows[1]["vs_others"] is not None and 0 <= rows[1]["slower_share"] <= 1


def cpu_ranks(*runs: tuple[Sequence[float], Sequence[float]]) -> tuple[RankRecord, ...]:
    """CPU ranks from (CPU ms, wall ms) per iteration: iter_ms is CPU time, iter_wall_ms
    and the timeline (iter_end_ms) the wall clock, one segment."""
    return tuple(RankRecord(
        rank=rank, host="vm", node_rank=0, local_rank=rank, device="cpu",
        device_name="CPU AMD EPYC", device_uuid=None, images=len(cpu) * 4, iters=len(cpu),
        wall_s=sum(wall) / 1e3, span_s=sum(wall) / 1e3, device_s=sum(wall) / 1e3,
        peak_memory_bytes=None, threads=1, iter_ms=tuple(float(t) for t in cpu),
        iter_end_ms=tuple(itertools.accumulate(float(t) for t in wall)),
        iter_wall_ms=tuple(float(t) for t in wall),
    ) for rank, (cpu, wall) in enumerate(runs))


def judged(records: tuple[RankRecord, ...]) -> dict[str, tuple[str, str]]:
    """{subject: (message, action)} of the straggler WARNs."""
    findings = straggler_findings(records, aggregate(records))
    return {str(f.subject or ""): (f.message, f.action or "") for f in findings
            if f.status is Status.WARN}


def test_a_rank_its_host_did_not_run_is_named_as_held_back_by_its_host() -> None:
    # Rank 1 computed as fast as rank 0 (CPU time) but was stopped 15% of the time it
    # ran (wall time 1.15x): the job waited for it. CPU time alone would call it OK.
    records = cpu_ranks((noisy(12), noisy(12)), (noisy(12), noisy(12, scale=1.15)))
    summary = aggregate(records)
    assert summary.paces[1].vs_others == pytest.approx(1.0)
    assert summary.paces[1].wall_vs_others == pytest.approx(1.15)
    assert summary.stragglers == (1,)
    [(subject, (message, action))] = judged(records).items()
    assert subject == "rank 1" and action == "fix-config"
    (finding,) = [f for f in straggler_findings(records, summary) if f.status is Status.WARN]
    assert finding.cause == "host_stall"  # the action follows from this, not the words
    assert finding.subject is not None and finding.subject.position() == "rank1"
    for part in ("rank 1 on vm", "held the job back", "1.15x", "in wall time",
                 "1.00x in CPU time", "its host did not run it",
                 "whole loop 1.15x the other ranks'"):
        assert part in message


def test_a_rank_that_computed_slower_is_named_as_slow_not_as_held_back_by_its_host() -> None:
    # More CPU time and so more wall time: the slow-device kind, whose action is rerun.
    records = cpu_ranks((noisy(12), noisy(12)),
                        (noisy(12, scale=1.15), noisy(12, scale=1.15)))
    [(subject, (message, action))] = judged(records).items()
    assert subject == "rank 1" and action == "rerun"
    assert straggler_findings(records, aggregate(records))[0].cause is None
    assert "1.15x" in message and "a slow CPU" in message and "in CPU time" in message
    assert "did not run" not in message
    hint = straggler_findings(records, aggregate(records))[0].hint or ""
    assert "quota" not in hint


def test_a_host_stall_hint_points_at_quotas_and_stopped_processes() -> None:
    records = cpu_ranks((noisy(12), noisy(12)), (noisy(12), noisy(12, scale=1.3)))
    [finding] = straggler_findings(records, aggregate(records))
    assert finding.hint and "quota" in finding.hint and "state T" in finding.hint


def test_healthy_cpu_ranks_within_the_threshold_in_both_clocks_stay_ok() -> None:
    records = cpu_ranks((noisy(12), noisy(12, scale=1.06)),
                        (noisy(12, scale=1.04), noisy(12, scale=0.99)))
    findings = straggler_findings(records, aggregate(records))
    assert [f.status for f in findings] == [Status.OK]
    assert "in CPU time" in findings[0].message and "in wall time" in findings[0].message


def test_a_rank_stopped_once_for_a_long_time_is_a_hiccup_not_a_straggler() -> None:
    # One iteration stalled for two seconds in wall time (a stopped process, continued):
    # the whole loop is 1.5x, the typical iteration is not.
    stalled = noisy(12)
    stalled[5] += 2000
    records = cpu_ranks((noisy(12), noisy(12)), (noisy(12), stalled))
    summary = aggregate(records)
    assert summary.vs_median[1] > 1.2
    assert summary.stragglers == ()


def test_gpu_ranks_have_one_clock_so_a_slow_gpu_is_never_called_a_host_stall() -> None:
    # CUDA events time the device's own timeline: no separate wall time per iteration.
    records = ranks(noisy(12), noisy(12, scale=1.3))
    [(_, (message, action))] = judged(records).items()
    assert "a slow GPU" in message and "did not run" not in message and action == "rerun"
    assert aggregate(records).paces[1].wall_vs_others == pytest.approx(1.3)


def test_a_rank_that_waited_for_a_shared_core_is_named_as_held_back_by_its_host() -> None:
    # Rank 1 got 70% of a core (its wall clock stretched 1.4x) while its computation took
    # as long as rank 0's: not a slow CPU, but the job waited for it all the same.
    fast, waited = ranks(flat(12), flat(12))
    waited = replace(waited, device="cpu", iter_end_ms=tuple(140.0 * (i + 1) for i in range(12)),
                     iter_wall_ms=(140.0,) * 12, wall_s=1.68)
    summary = aggregate((replace(fast, device="cpu"), waited))
    assert summary.vs_median[1] > summary.vs_median[0] * 1.3
    assert summary.paces[1].vs_others == pytest.approx(1.0)
    assert summary.paces[1].wall_vs_others == pytest.approx(1.4)
    assert summary.stragglers == (1,)


def test_iterations_are_lined_up_by_the_clock_not_by_their_index() -> None:
    # Rank 1 started slow (an external load on its core stretched its wall clock) and
    # then, at the same moments as rank 0, both ran a slower phase: 100 ms, then 150 ms.
    zero = replace(ranks([100.0] * 6 + [150.0] * 6)[0],
                   iter_end_ms=tuple(itertools.accumulate([100.0] * 6 + [150.0] * 6)))
    ends_one = [200.0 * (i + 1) for i in range(3)] + [600 + 150.0 * (i + 1) for i in range(9)]
    one = replace(ranks(flat(12), [100.0] * 3 + [150.0] * 9)[1], iter_end_ms=tuple(ends_one))
    summary = aggregate((zero, one))
    assert summary.paces[1].p50_ms / summary.paces[0].p50_ms == pytest.approx(1.5)
    assert summary.paces[1].vs_others == pytest.approx(1.0)
    # Not a slow device (its loop, 1.1x rank 0's, is judged on its own: issue 21).
    assert straggler_kind(summary.paces[1], summary.threshold) != SLOW_DEVICE


def test_cpu_marks_give_cpu_time_per_iteration_and_the_wall_clock_timeline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from gpucheck import timing

    # Recorded clocks: 20 ms of computation (CPU time and wall alike), then 50 ms of
    # waiting, as for a core another process holds (wall only; 0.1 ms of CPU).
    cpu, wall = iter([0.0, 0.020, 0.0201]), iter([0.0, 0.021, 0.071])
    monkeypatch.setattr(timing, "time", SimpleNamespace(process_time=lambda: next(cpu),
                                                        perf_counter=lambda: next(wall)))
    timeline = timing.Marks("cpu", 3)
    timeline.begin()
    timeline.mark()
    timeline.mark()
    took, ends = timeline.read_ms()
    assert took == pytest.approx((20.0, 0.1))
    assert ends == pytest.approx((21.0, 71.0))  # the wait is on the timeline, not in took


def coarse(n: int, stalls: int, stall_ms: float) -> list[float]:
    """n iterations of about 100 ms, `stalls` of them (spread out) `stall_ms` longer."""
    times = noisy(n)
    for i in range(stalls):
        times[(i * n) // stalls + 1] += stall_ms
    return times


def test_a_coarse_stall_is_named_by_what_it_cost_the_job_though_its_median_is_fine() -> None:
    # Stopped 300 ms three times in 12 iterations: the median iteration is untouched,
    # the loop took 1.75x as long and the other ranks waited for it.
    records = cpu_ranks((noisy(12), noisy(12)), (noisy(12), coarse(12, 3, 300.0)),
                        (noisy(12), noisy(12)))
    summary = aggregate(records)
    pace = summary.paces[1]
    assert pace.wall_vs_others < 1.1 and pace.hold_back > 1.5
    assert summary.stragglers == (1,)
    [(subject, (message, action))] = judged(records).items()
    assert subject == "rank 1" and action == "fix-config" and "its host did not run it" in message


def test_the_hold_back_bar_rises_to_the_healthy_ranks_own_spread() -> None:
    # Five healthy ranks whose loops spread from 0.8x to 1.2x (a noisy job): a rank
    # 1.15x behind the median is inside that spread; with healthy ranks in step it is not.
    spread = [noisy(12, scale) for scale in (0.8, 0.9, 1.0, 1.1, 1.2)]
    behind = coarse(12, 4, 60.0)  # 240 ms of stalls: about 1.15x the others' loop
    noisy_job = cpu_ranks(*((t, t) for t in spread), (noisy(12), behind))
    summary = aggregate(noisy_job)
    assert summary.paces[5].hold_back > 1.1
    assert summary.paces[5].others_spread > 0.2 and 5 not in summary.stragglers
    calm = cpu_ranks(*((noisy(12), noisy(12)) for _ in range(5)), (noisy(12), behind))
    calm_summary = aggregate(calm)
    assert calm_summary.paces[5].others_spread == 0 and calm_summary.stragglers == (5,)
