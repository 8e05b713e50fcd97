"""The fault watch's wiring, in this process: the frame (`process_group` and
gpucheck.distributed.faultwatch) on one gloo rank watching a fake GPU, the failure
path's partial results, the report builders, and the slowdown causes that the
straggler findings quote. The multi-process runs are in test_faults_wiring_runs.py."""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import pytest
from plant import Plant, planted

from gpucheck.comm.report import Verdicts as CommVerdicts
from gpucheck.comm.report import comm_sections
from gpucheck.commands import bench as bench_command
from gpucheck.context import RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.session import process_group
from gpucheck.faults import run_faults_section, slowdown_causes
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Status
from gpucheck.stress.report import Verdicts as StressVerdicts
from gpucheck.stress.report import stress_sections
from gpucheck.stress.verdicts import peer_findings
from tests.fake_pynvml import FakeGpu, FakeNvml

BUS = "00000000:9A:00.0"
XID = 0x8  # nvmlEventTypeXidCriticalError
WATCHED = (BUS,)  # this one rank watches fake GPU 1 (Plant.fault_bus)


@pytest.fixture
def watched() -> Iterator[RunContext]:
    """A context whose one rank watches fake GPU 1 through the planted bus override."""
    with planted(Plant(fault_bus=WATCHED)):
        yield RunContext()
LABEL = f"GPU 1 (NVIDIA H200, bus {BUS}, GPU-00000001-0000-0000-0000-000000000000)"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Two fake H200s; this CPU rank watches GPU 1 through the test-only bus override."""
    fake = FakeNvml([FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(bus_id=BUS)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


@pytest.fixture
def doorways(monkeypatch: pytest.MonkeyPatch) -> list[Nvml]:
    """Every NVML doorway the frame opens."""
    opened: list[Nvml] = []

    class Counted(Nvml):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(faultwatch, "Nvml", Counted)
    return opened


def test_the_frame_watches_the_rank_through_one_doorway_and_gathers_its_result(
        fake: FakeNvml, doorways: list[Nvml], watched: RunContext) -> None:
    ctx = watched
    with process_group("gloo", "cpu", 30, ctx=ctx) as world:
        faultwatch.of(ctx).mark_start()
        assert fake.deliver_event(1, XID, 79) == 1
        faultwatch.of(ctx).mark_end()
        results = faultwatch.of(ctx).gather()
    assert world.rank == 0 and len(doorways) == 1
    assert not fake.initialised  # the frame shut its doorway when the group was left
    (result,) = results
    assert (result["rank"], result["status"], result["gpu"]) == (0, "watched", LABEL)
    assert [(e["xid"], e["in_timed_loop"]) for e in result["events"]] == [(79, True)]
    assert result["clocks"]["window"] == "timed"


def test_a_failed_run_publishes_rank_zeros_result_with_its_partial_results(
        fake: FakeNvml, watched: RunContext) -> None:
    ctx = watched
    with pytest.raises(RuntimeError, match="simulated"), \
            process_group("gloo", "cpu", 30, ctx=ctx):
        progress.publish_partial(ctx, {"measured": 1})
        fake.deliver_event(1, XID, 79)
        raise RuntimeError("simulated failure in the load")
    partial = progress.local_partial(ctx)
    assert partial is not None and partial["measured"] == 1
    (result,) = partial["faults"]
    assert result["status"] == "watched" and [e["xid"] for e in result["events"]] == [79]
    assert result["counters"]["ecc_uncorrected"]["after"] == 0  # stopped: both snapshots


def test_no_fault_watch_opens_no_doorway_and_reports_every_rank_as_off(
        fake: FakeNvml, doorways: list[Nvml], watched: RunContext) -> None:
    ctx = watched
    with process_group("gloo", "cpu", 30, fault_watch=False, ctx=ctx):
        faultwatch.of(ctx).mark_start()
        faultwatch.of(ctx).mark_end()
        results = faultwatch.of(ctx).gather()
    assert doorways == [] and not fake.initialised
    assert results == [{"rank": 0, "status": "n/a", "reason": faultwatch.OFF_REASON}]


def test_a_cpu_rank_without_the_override_opens_no_doorway(
        fake: FakeNvml, doorways: list[Nvml]) -> None:
    ctx = RunContext()
    with process_group("gloo", "cpu", 30, ctx=ctx):
        (result,) = faultwatch.of(ctx).gather()
    assert doorways == []
    assert (result["status"], result["reason"]) == ("n/a", "no GPU: this rank runs on the CPU")


@pytest.mark.parametrize(("value", "rank", "expected"), [
    ((), 0, None), (("A", None, "B"), 0, "A"), (("A", None, "B"), 1, None),
    (("A", None, "B"), 2, "B"), (("A",), 5, None)])
def test_the_test_bus_override_gives_each_rank_its_own_entry(
        value: tuple[str | None, ...], rank: int, expected: str | None) -> None:
    assert Plant(fault_bus=value).bus_id(rank) == expected


def _watched(rank: int, fractions: dict[str, float], samples: int = 10,
             slowdown_ms: dict[str, float | None] | None = None) -> dict[str, Any]:
    return {"rank": rank, "status": "watched",
            "clocks": {"window": "timed", "window_s": 10.0, "samples": samples,
                       "fractions": fractions, "slowdown_ms": slowdown_ms or {}}}


def test_slowdown_causes_name_the_ranks_over_the_threshold_in_the_warnings_words() -> None:
    results = [_watched(0, {"hw_thermal_slowdown": 0.05}),
               _watched(1, {"hw_thermal_slowdown": 0.4}),
               _watched(2, {"hw_thermal_slowdown": 0.9}, samples=3),  # too few samples
               _watched(3, {}, samples=3, slowdown_ms={"hw_power_brake_slowdown": 2500.0}),
               {"rank": 4, "status": "n/a", "reason": "no GPU: this rank runs on the CPU"}]
    assert slowdown_causes(results) == {
        1: "was in HW thermal slowdown 40% of the timed loop",
        3: "was in HW power brake slowdown 25% of the timed loop"}
    assert slowdown_causes(results[1:2], window="measured phases") == {
        1: "was in HW thermal slowdown 40% of the measured phases"}


def test_a_slow_stress_rank_warning_says_what_slowed_it() -> None:
    ranks = [{"rank": r, "node_rank": 0, "host": "n0", "device": "cpu"} for r in range(3)]
    causes = {1: "was in HW thermal slowdown 40% of the measured phases",
              2: "was in HW slowdown 30% of the measured phases"}
    findings = peer_findings("stress.sdc.straggler", "median product time", "ms",
                             {0: 10.0, 1: 20.0, 2: 10.0}, ranks, 0.9,
                             higher_is_better=False, causes=causes)
    assert [(f.status, f.subject.label) for f in findings] == [(Status.WARN, "rank 1")]
    # The cause follows the figure; a single measurement's look says it was not
    # measured again.
    assert findings[0].message.endswith("; it was in HW thermal slowdown 40% of the "
                                        "measured phases")
    assert findings[0].look is not None and findings[0].look.state.value == \
        "not measured again"


def test_ranks_whose_watch_did_not_come_back_are_named_not_dropped() -> None:
    section = run_faults_section([{"rank": 0, "status": "n/a", "reason": "no GPU"}],
                                 ranks=[0, 1, 2])
    messages = [f.message for f in section.findings]
    assert messages == ["hardware fault watching n/a on rank 0: no GPU",
                        "hardware fault watching n/a on ranks 1, 2: its watch did not come "
                        "back (the run ended before the ranks' results were gathered)"]


def test_a_failure_before_any_result_still_reports_rank_zeros_faults(
        fake: FakeNvml, watched: RunContext) -> None:
    ctx = watched
    with pytest.raises(RuntimeError), process_group("gloo", "cpu", 30, ctx=ctx):
        fake.deliver_event(1, XID, 79)
        raise RuntimeError("simulated failure before the first measurement")
    partial = progress.local_partial(ctx)
    assert partial is not None and set(partial) == {"faults"}
    comm = comm_sections(partial, CommVerdicts(0.5, None, 0.9))
    stress = stress_sections(partial, StressVerdicts(0.9, 0.8, 0.6))
    for sections in (comm, stress):
        assert [s.name for s in sections] == ["faults"]
        assert [(f.check, f.status, f.subject.label) for f in sections[0].findings
                if f.status is Status.FAIL] == [("faults.xid", Status.FAIL,
                                                 f"rank 0 on {LABEL}")]


def test_benchs_stop_report_shows_rank_zeros_faults_apart_from_its_partial_numbers(
        fake: FakeNvml, watched: RunContext) -> None:
    ctx = watched
    with pytest.raises(KeyboardInterrupt), \
            process_group("gloo", "cpu", 30, ctx=ctx):
        progress.publish_partial(ctx, {"rank0_warmup": {"iters": 2}})
        raise KeyboardInterrupt
    report = bench_command.partial_report(Namespace(), ctx)
    assert report is not None
    assert [s.name for s in report.sections] == ["partial", "faults"]
    assert report.section("partial").data == {"rank0_warmup": {"iters": 2}}
    assert [f.status for f in report.section("faults").findings] == [Status.OK]


def test_a_watcher_that_cannot_start_leaves_the_load_running_and_says_why(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, watched: RunContext) -> None:
    def broken(self: Any) -> None:
        raise ValueError("a watcher bug")

    monkeypatch.setattr(faultwatch.FaultWatch, "start", broken)
    ctx = watched
    with process_group("gloo", "cpu", 30, ctx=ctx):
        faultwatch.of(ctx).mark_start()
        faultwatch.of(ctx).mark_end()
        (result,) = faultwatch.of(ctx).gather()
    assert result["status"] == "n/a" and "a watcher bug" in result["reason"]
    (finding,) = run_faults_section([result]).findings
    assert finding.status is Status.SKIP and "did not start" in finding.message
