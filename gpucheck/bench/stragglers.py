"""The straggler verdict's findings: which rank held the job back, and which kind of
straggler it is (gpucheck.bench.pace; docs/bench.md, "Stragglers")."""

from __future__ import annotations

from collections.abc import Mapping

from gpucheck import subject
from gpucheck.bench.pace import (
    HOST_STALL,
    MIN_JUDGED_ITERS,
    BenchSummary,
    RankPace,
    confirmed,
    hold_back_bar,
    straggler_kind,
    suspect,
    wall_ms,
)
from gpucheck.bench.records import RankRecord
from gpucheck.measure import Better, Bound, LookState, SecondLook
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stats import percentile
from gpucheck.subject import Subject

CHECK = "bench.rank.straggler"


def straggler_findings(records: tuple[RankRecord, ...], summary: BenchSummary,
                       causes: Mapping[int, str] | None = None) -> list[Finding]:
    """WARN per straggler, saying its kind; `causes`: why a rank was slow (the fault
    watcher's words), appended to its WARN."""
    if summary.n_ranks < 2:
        return [ok(CHECK, f"not judged: {summary.judged}")]
    if summary.judged != "yes":
        return [skip(CHECK, f"not judged: {summary.judged}; time at least "
                     f"{MIN_JUDGED_ITERS} iterations (--iters) to judge stragglers")]
    by_rank = {r.rank: r for r in records}
    paces = {p.rank: p for p in summary.paces}
    findings = []
    for rank in summary.stragglers:
        record, pace = by_rank[rank], paces[rank]
        stalled = straggler_kind(pace, summary.threshold) == HOST_STALL
        if stalled:
            message, hint = _host_message(record, pace), HOST_HINT
        else:
            message, hint = _device_message(record, pace), _device_hint(record)
        why = f"; {causes[rank]}" if causes and causes.get(rank) else ""
        # The host-stall kind is data for the action (fix-config), not words in the message.
        findings.append(warn(CHECK, message + why, hint=hint, subject=rank_subject(record),
                             cause="host_stall" if stalled else None,
                             look=_look(pace, summary.threshold)))
    if not findings:
        findings.append(ok(CHECK, _no_straggler_message(records, summary)))
        findings += [_cleared(by_rank[p.rank], p, summary.threshold) for p in summary.paces
                     if suspect(p, summary.threshold)]
    return findings


def _look(pace: RankPace, threshold: float) -> SecondLook | None:
    """A suspect's second look as data: its loop's ratio the first time and again; None
    for a rank whose loop kept pace."""
    if not suspect(pace, threshold):
        return None
    bound = Bound(hold_back_bar(pace, threshold), Better.LOWER)
    if pace.again is None:
        return SecondLook(pace.whole, None, None, (), "x", bound, LookState.NOT_MEASURED,
                          why_not="the loop was not run again")
    state = LookState.CONFIRMED if confirmed(pace, threshold) else LookState.UNSTABLE
    # Ratios to the other ranks' loops: the reference is theirs, 1x, so none is shown.
    return SecondLook(pace.whole, pace.again, None, (), "x", bound, state)


def _cleared(record: RankRecord, pace: RankPace, threshold: float) -> Finding:
    """An OK keeping the look of a suspect not named (within the bar over both loops, or
    one stall only)."""
    bar = hold_back_bar(pace, threshold)
    if pace.again is not None and pace.both is not None:
        how = (f"{pace.again:.2f}x when the loop ran again, {pace.both:.2f}x over both "
               f"loops: within the bar {bar:.2f}, not a straggler")
    else:
        walls = wall_ms(record)
        stall = max(walls) - percentile(walls, 50)
        how = (f"{pace.hold_back:.2f}x without its longest stall ({stall:.0f} ms in one "
               "iteration), and the loop was not run again: one stall names no straggler")
    return ok(CHECK, f"rank {record.rank} on {record.host}: its timed loop took "
              f"{pace.whole:.2f}x as long as the other ranks', {how}",
              subject=rank_subject(record), look=_look(pace, threshold))


def _clock(record: RankRecord) -> str:
    return "GPU time" if record.device.startswith("cuda") else "CPU time"


def _device_message(record: RankRecord, pace: RankPace) -> str:
    slower = round(pace.slower_share * record.iters)
    what = "GPU" if record.device.startswith("cuda") else "CPU"
    wall = ("" if not record.iter_wall_ms else
            f", {pace.wall_vs_others:.2f}x in wall time")
    return (f"rank {record.rank} on {record.host} ({record.gpu_label()}) ran its iterations "
            f"{pace.vs_others:.2f}x as long as the other ranks at the same moments in "
            f"{_clock(record)} (median over {record.iters}; slower in {slower} of them)"
            f"{wall}: a slow {what}, it computed slower; p50 {pace.p50_ms:.4g} ms vs the "
            f"others' {pace.others_p50_ms:.4g} ms, whole loop {pace.whole:.2f}x the other ranks'"
            f"{_again_words(pace)}")


def _again_words(pace: RankPace) -> str:
    if pace.again is None or pace.both is None:
        return ""
    return f", {pace.again:.2f}x when run again, {pace.both:.2f}x over both loops"


def _host_message(record: RankRecord, pace: RankPace) -> str:
    """What it cost the job first (the loop), then its typical iteration."""
    slower = round(pace.wall_slower_share * record.iters)
    waited = f"the others waited {pace.waited_ms / 1e3:.3g} s for it at the end barriers"
    if pace.again is not None and pace.both is not None:  # named over both loops
        cost = (f"its timed loop took {pace.whole:.2f}x as long as the other ranks' in wall "
                f"time, {pace.again:.2f}x when the loop ran again, {pace.both:.2f}x over "
                f"both loops ({waited})")
    else:
        cost = (f"its timed loop took {pace.hold_back:.2f}x as long as the other ranks' in "
                f"wall time (each loop without its longest single stall, when that is "
                f"less; {waited})")
    return (f"rank {record.rank} on {record.host} ({record.gpu_label()}) held the job back: "
            f"{cost}, its typical iteration "
            f"{pace.wall_vs_others:.2f}x (median over {record.iters}; slower in {slower} of "
            f"them), yet {pace.vs_others:.2f}x in {_clock(record)}: its host did not run "
            f"it part of the time; whole loop {pace.whole:.2f}x the other ranks'")


def _no_straggler_message(records: tuple[RankRecord, ...], summary: BenchSummary) -> str:
    worst = max(summary.paces, key=lambda p: p.vs_others)
    clock = _clock(min(records, key=lambda r: r.rank))
    text = (f"all {summary.n_ranks} rank(s) within {summary.threshold:.0%} of the other "
            f"ranks at the same moments (slowest: rank {worst.rank}, {worst.vs_others:.3f}x "
            f"in {clock}")
    if any(r.iter_wall_ms for r in records):
        late = max(summary.paces, key=lambda p: p.wall_vs_others)
        text += f"; rank {late.rank}, {late.wall_vs_others:.3f}x in wall time"
    held = max(summary.paces, key=lambda p: p.hold_back)
    return text + (f"; no rank held the job back: largest loop hold-back rank {held.rank}, "
                   f"{held.hold_back:.3f}x, bar {hold_back_bar(held, summary.threshold):.3f}"
                   f"; wall spread {summary.spread:.3f})")


def _device_hint(record: RankRecord) -> str:
    if record.device.startswith("cuda"):
        return ("check that GPU's clocks, temperature, power limit and PCIe link (gpucheck "
                "env, nvidia-smi -q -d PERFORMANCE); if they are normal, its host may have "
                "kept it waiting for work (CUDA events count the GPU's idle gaps too: a CPU "
                "quota or a busy core on that rank's host); the job runs at the slowest "
                "rank's pace")
    return ("CPU ranks are timed in CPU time, so waiting for a busy core does not count: "
            "that rank computed slower (a slower or shared physical core, memory placement "
            "on a VM); rerun, and check what else runs on the host (top); the job runs at "
            "the slowest rank's pace")


HOST_HINT = ("the rank computed at the others' pace but was not running part of the time: "
             "look for a CPU quota or limit on its process or container (throttled time in "
             "its cgroup's cpu.stat; docker --cpus, a Kubernetes CPU limit), other processes "
             "on its cores (top, pidstat), a process stopped and continued (state T in ps), "
             "or, in a training job, a data loader it waits for; the job runs at the "
             "slowest rank's pace")


def rank_subject(record: RankRecord) -> Subject:
    return subject.rank(record.rank, host=record.host, node=record.node_rank,
                        gpu=record.nvml_index, bus_id=record.pci_bus_id)
