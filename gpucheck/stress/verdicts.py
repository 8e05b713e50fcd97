"""Verdicts over per-rank numbers: against the node's peers, an expected figure, a link.

Pure functions of plain numbers, so they are tested with handcrafted values.

- Peers: a rank is slow when its rate is below `fraction` x its node's median rate
  (a time: above the median / `fraction`). Rates come from the median iteration,
  so one hiccup does not make a straggler; a rank that is slow throughout does.
- Expected: below `fraction` x the model's typical figure (peak x typical fraction).
- Link: a host copy below `fraction` x the PCIe link's one-direction rate.

Confirm before condemning (as DCGM's diagnostics and the cloud providers' health
checks re-test a suspect): a rank below a bound is measured again, every rank of the
job at once as the first time (`suspect_ranks` picks them in the worker, where the
process group is still alive). Slow again: the WARN says "confirmed" and against
what. Fine the second time: a WARN "unstable" with action `rerun`, never more.
Not measured again (a run stopped in between, or an older report): said so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.distributed.checkin import device_label
from gpucheck.distributed.nodes import group_by_node
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stress.specs import Figure

DEFAULT_PEER_FRACTION = 0.9
DEFAULT_EXPECTED_FRACTION = 0.8
DEFAULT_COPY_FRACTION = 0.6


@dataclass(frozen=True)
class Subject:
    """What a finding names: the rank and, in words, where it ran."""

    rank: int
    label: str  # "rank 3 (node 0 gpu7, cuda:3 GPU 3 (NVIDIA H200, bus ..., GPU-...))"

    @property
    def subject(self) -> str:
        return f"rank {self.rank}"


def subjects(ranks: Sequence[Mapping[str, Any]]) -> dict[int, Subject]:
    """Each rank named with its node and the physical GPU it used (NVML index, bus id,
    UUID: `GpuIdentity.label()`), or its check-in device when it has no GPU."""
    return {int(r["rank"]): Subject(int(r["rank"]), f"rank {r['rank']} (node {r['node_rank']} "
                                    f"{r['host']}, {r.get('gpu') or device_label(r)})")
            for r in ranks}


def suspect_ranks(values: Mapping[int, float], ranks: Sequence[Mapping[str, Any]],
                  fraction: float, figure_of: Callable[[str | None], Figure | None],
                  expected_fraction: float, higher_is_better: bool = True) -> list[int]:
    """Ranks below `fraction` x their node's median, or below `expected_fraction` x
    their model's typical figure: the ones to measure again before a WARN."""
    found: set[int] = set()
    for members in group_by_node(ranks).values():
        mine = {r: values[r] for r in members if values.get(r) is not None}
        if len(mine) >= 2:
            found |= set(slow_vs_median(mine, fraction, higher_is_better)[1])
    for row in ranks:
        rank, figure = int(row["rank"]), figure_of(row.get("gpu_name"))
        if figure is not None and rank in values and \
                values[rank] < expected_fraction * figure.typical:
            found.add(rank)
    return sorted(found)


@dataclass(frozen=True)
class Again:
    """A second measurement of every rank, and what it is judged against."""

    values: Mapping[int, float]  # rank -> the re-measured figure

    def node_ratio(self, rank: int, members: Sequence[int]) -> tuple[float, float] | None:
        """(re-measured value / its node's re-measured median, that median)."""
        mine = [self.values[m] for m in members if m in self.values]
        if rank not in self.values or not mine:
            return None
        median = float(statistics.median(mine))
        return (self.values[rank] / median if median > 0 else 1.0), median


def again_of(rows: Sequence[Mapping[str, Any]] | None, key: str,
             dtype: str | None = None) -> Again | None:
    """The second measurement's figures (of one dtype); None when there was none."""
    mine = [r for r in rows or [] if dtype is None or r.get("dtype") == dtype]
    return Again({int(r["rank"]): float(r[key]) for r in mine}) if mine else None


UNSTABLE_HINT = ("below its bound once, within it when measured again with every rank at "
                 "once: a transient (another process, a clock or power change); rerun, and "
                 "look into this GPU if it comes back")


def slow_vs_median(values: Mapping[int, float], fraction: float,
                   higher_is_better: bool = True) -> tuple[float, dict[int, float]]:
    """(the median, {rank: value / median} for each rank worse than the bound)."""
    median = float(statistics.median(values.values()))
    if median <= 0:
        return median, {}
    slow = {}
    for rank, value in sorted(values.items()):
        ratio = value / median
        if (ratio < fraction) if higher_is_better else (ratio > 1 / fraction):
            slow[rank] = ratio
    return median, slow


def peer_findings(check: str, what: str, unit: str, values: Mapping[int, float],
                  ranks: Sequence[Mapping[str, Any]], fraction: float,
                  higher_is_better: bool = True,
                  causes: Mapping[int, str] | None = None,
                  again: Again | None = None) -> list[Finding]:
    """Per node, WARN for each rank worse than `fraction` of the node's median.
    `causes`: rank -> what the fault watch saw slow it ("was in HW thermal slowdown
    40% of the measured phases", `gpucheck.faults.slowdown_causes`), added to its WARN.
    `again`: every rank measured a second time; None when it was not (see above)."""
    names = subjects(ranks)
    findings: list[Finding] = []
    compared = 0
    for node, members in group_by_node(ranks).items():
        mine = {r: values[r] for r in members if values.get(r) is not None}
        if len(mine) < 2:
            continue
        compared += len(mine)
        median, slow = slow_vs_median(mine, fraction, higher_is_better)
        for rank, ratio in slow.items():
            text = (f"{names[rank].label}: {what} {mine[rank]:.4g} {unit}, {ratio:.2f}x the "
                    f"median of {node.label}'s {len(mine)} ranks ({median:.4g} {unit})"
                    + (f"; it {causes[rank]}" if causes and rank in causes else ""))
            second = again.node_ratio(rank, list(mine)) if again else None
            findings.append(_peer_verdict(check, text, unit, second, fraction,
                                          higher_is_better, names[rank], again is not None))
    if compared == 0:
        return [skip(check, f"{what}: one rank per node, no peers to compare with")]
    if not findings:
        bound = f"within {1 - fraction:.0%} of" if higher_is_better else \
            f"at most {1 / fraction - 1:.0%} slower than"
        findings.append(ok(check, f"{what}: all {compared} ranks {bound} their node's median"))
    return findings


def _peer_verdict(check: str, text: str, unit: str, second: tuple[float, float] | None,
                  fraction: float, higher_is_better: bool, name: Subject,
                  measured_again: bool) -> Finding:
    """A slow rank's WARN: confirmed by its second measurement, or unstable (rerun)."""
    hint = ("this GPU is slower than its peers: check its clocks, temperature, power "
            "limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER) and "
            "whether another process uses it")
    if second is None:
        why = "the rank was not" if measured_again else "not"
        return warn(check, f"{text}; {why} measured again", hint=hint, subject=name.subject)
    ratio, median = second
    slow = ratio < fraction if higher_is_better else ratio > 1 / fraction
    again = (f"measured again with its node's ranks at once: {ratio:.2f}x their median "
             f"({median:.4g} {unit})")
    if slow:
        return warn(check, f"{text}; confirmed: {again}", hint=hint, subject=name.subject)
    return warn(check, f"{text}; unstable: {again}", hint=UNSTABLE_HINT,
                subject=name.subject, action="rerun")


def expected_findings(check: str, what: str, unit: str, values: Mapping[int, float],
                      ranks: Sequence[Mapping[str, Any]],
                      figure_of: Callable[[str | None], Figure | None],
                      fraction: float, again: Again | None = None) -> list[Finding]:
    """Each rank against its GPU model's typical figure; SKIP for models without one.
    A rank below it is judged again on its second measurement (`again`)."""
    names = subjects(ranks)
    findings: list[Finding] = []
    unknown: dict[str, list[int]] = {}
    passed: dict[str, tuple[Figure, list[int]]] = {}
    for row in ranks:
        rank, model = int(row["rank"]), row.get("gpu_name")
        figure = figure_of(model)
        if rank not in values:
            continue
        if figure is None:
            unknown.setdefault(model or "CPU", []).append(rank)
            continue
        if values[rank] < fraction * figure.typical:
            finding = _below_expected(check, what, unit, values[rank], figure, fraction,
                                      names[rank])
            findings.append(_expected_again(check, finding, again, rank, figure, fraction,
                                            unit))
        else:
            passed.setdefault(model, (figure, []))[1].append(rank)
    for model, (figure, members) in passed.items():
        findings.append(ok(check, f"{what}: {len(members)} {model} rank(s) at or above "
                           f"{fraction:g} x the typical {figure.typical:.4g} {unit} "
                           f"({_figure_words(figure, unit)})"))
    for model, members in unknown.items():
        findings.append(skip(check, f"{what}: no expected figure for {model} "
                             f"(rank(s) {', '.join(map(str, members))}); the node's peers "
                             "are the comparison"))
    return findings


def _expected_again(check: str, finding: Finding, again: Again | None, rank: int, figure: Figure,
                    fraction: float, unit: str) -> Finding:
    """The below-expected WARN, confirmed or unstable by the rank's second figure."""
    if again is None or rank not in again.values:
        return warn(check, f"{finding.message}; not measured again",
                    hint=finding.hint or "", subject=finding.subject)
    value = again.values[rank]
    words = f"measured again at {value:.4g} {unit}, {value / figure.typical:.2f}x the typical"
    if value < fraction * figure.typical:
        return warn(check, f"{finding.message}; confirmed: {words}",
                    hint=finding.hint or "", subject=finding.subject)
    return warn(check, f"{finding.message}; unstable: {words}", hint=UNSTABLE_HINT,
                subject=finding.subject, action="rerun")


def _figure_words(figure: Figure, unit: str) -> str:
    how = "measured" if figure.measured else "estimated"
    return f"peak {figure.peak:.4g} {unit} x {figure.typical_fraction:g} {how}"


def _below_expected(check: str, what: str, unit: str, value: float, figure: Figure,
                    fraction: float, name: Subject) -> Finding:
    return warn(check, f"{name.label}: {what} {value:.4g} {unit}, {value / figure.typical:.2f}x "
                f"the typical {figure.typical:.4g} {unit} for this model "
                f"({_figure_words(figure, unit)}; source: {figure.source})",
                hint="the GPU reaches much less than a healthy one of its model: check clocks, "
                "power limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,POWER), and "
                "compare with the node's other GPUs above", subject=name.subject)


def link_findings(check: str, rows: Sequence[Mapping[str, Any]],
                  ranks: Sequence[Mapping[str, Any]], fraction: float,
                  again: Again | None = None) -> list[Finding]:
    """Host copies of each rank measured alone against its link's one-direction rate;
    `again`: each rank's slower direction alone, measured a second time."""
    names = subjects(ranks)
    findings: list[Finding] = []
    unknown = []
    for row in rows:
        rank, rate = int(row["rank"]), row.get("link_gbps")
        if not rate:
            unknown.append(rank)
            continue
        worst = min(row["h2d_gbps"], row["d2h_gbps"])
        if worst < fraction * rate:
            findings.append(_link_again(check, warn(
                check, f"{names[rank].label}: host copies alone {row['h2d_gbps']:.3g} GB/s "
                f"H2D, {row['d2h_gbps']:.3g} GB/s D2H, below {fraction:g} x its link's "
                f"{rate:.3g} GB/s ({row.get('link')})",
                hint="check the link (nvidia-smi -q -d PCIE; lspci -vv for its width and "
                "speed), the slot and riser, and that the rank runs on its GPU's NUMA node",
                subject=names[rank].subject), again, rank, fraction * rate))
    if unknown:
        findings.append(skip(check, "PCIe link rate unknown (sysfs has no link speed/width) "
                             f"for rank(s) {', '.join(map(str, unknown))}"))
    checked = len(rows) - len(unknown)
    if checked and not any(f.status.value == "WARN" for f in findings):
        findings.append(ok(check, f"{checked} rank(s) copy at or above {fraction:g} x their "
                           "PCIe link's rate"))
    return findings


def _link_again(check: str, finding: Finding, again: Again | None, rank: int,
                bound: float) -> Finding:
    """The slow-link WARN, confirmed or unstable by the rank's second copies alone."""
    if again is None or rank not in again.values:
        return warn(check, f"{finding.message}; not measured again",
                    hint=finding.hint or "", subject=finding.subject)
    value = again.values[rank]
    words = f"measured again alone at {value:.3g} GB/s (slower direction)"
    if value < bound:
        return warn(check, f"{finding.message}; confirmed: {words}",
                    hint=finding.hint or "", subject=finding.subject)
    return warn(check, f"{finding.message}; unstable: {words}", hint=UNSTABLE_HINT,
                subject=finding.subject, action="rerun")


def copy_suspects(rows: Sequence[Mapping[str, Any]], ranks: Sequence[Mapping[str, Any]],
                  copy_fraction: float, peer_fraction: float) -> list[int]:
    """Ranks whose host copies alone are below `copy_fraction` x their link's rate, or
    whose copies all at once are below `peer_fraction` x their node's median."""
    found = {int(r["rank"]) for r in rows if r.get("link_gbps") and
             r.get("h2d_alone_gbps") is not None and
             min(r["h2d_alone_gbps"], r["d2h_alone_gbps"]) < copy_fraction * r["link_gbps"]}
    together = {int(r["rank"]): min(r["h2d_together_gbps"], r["d2h_together_gbps"])
                for r in rows}
    return sorted(found | set(suspect_ranks(together, ranks, peer_fraction, lambda _: None,
                                            0.0)))


def copies_again(rows: Sequence[Mapping[str, Any]] | None,
                 setting: str) -> Again | None:
    """The second copies' slower direction per rank, "alone" or "together"."""
    if not rows:
        return None
    values = {int(r["rank"]): min(r[f"h2d_{setting}_gbps"], r[f"d2h_{setting}_gbps"])
              for r in rows if r.get(f"h2d_{setting}_gbps") is not None}
    return Again(values)
