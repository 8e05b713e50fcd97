"""Verdicts over per-rank numbers: against the node's peers, an expected figure, a link.

Pure functions of plain numbers, so they are tested with handcrafted values.

- Peers: a rank is slow when its rate is below `fraction` x its node's median rate
  (a time: above the median / `fraction`). Rates come from the median iteration,
  so one hiccup does not make a straggler; a rank that is slow throughout does.
- Expected: below `fraction` x the model's typical figure (peak x typical fraction).
- Link: a host copy below `fraction` x the PCIe link's one-direction rate.
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
                  causes: Mapping[int, str] | None = None) -> list[Finding]:
    """Per node, WARN for each rank worse than `fraction` of the node's median.
    `causes`: rank -> what the fault watch saw slow it ("was in HW thermal slowdown
    40% of the measured phases", `gpucheck.faults.slowdown_causes`), added to its WARN."""
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
            findings.append(warn(
                check, f"{names[rank].label}: {what} {mine[rank]:.4g} {unit}, {ratio:.2f}x the "
                f"median of {node.label}'s {len(mine)} ranks ({median:.4g} {unit})"
                + (f"; it {causes[rank]}" if causes and rank in causes else ""),
                hint="this GPU is slower than its peers: check its clocks, temperature, power "
                "limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER) and "
                "whether another process uses it", subject=names[rank].subject))
    if compared == 0:
        return [skip(check, f"{what}: one rank per node, no peers to compare with")]
    if not findings:
        bound = f"within {1 - fraction:.0%} of" if higher_is_better else \
            f"at most {1 / fraction - 1:.0%} slower than"
        findings.append(ok(check, f"{what}: all {compared} ranks {bound} their node's median"))
    return findings


def expected_findings(check: str, what: str, unit: str, values: Mapping[int, float],
                      ranks: Sequence[Mapping[str, Any]],
                      figure_of: Callable[[str | None], Figure | None],
                      fraction: float) -> list[Finding]:
    """Each rank against its GPU model's typical figure; SKIP for models without one."""
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
            findings.append(_below_expected(check, what, unit, values[rank], figure, fraction,
                                            names[rank]))
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
                  ranks: Sequence[Mapping[str, Any]], fraction: float) -> list[Finding]:
    """Host copies of each rank measured alone against its link's one-direction rate."""
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
            findings.append(warn(
                check, f"{names[rank].label}: host copies alone {row['h2d_gbps']:.3g} GB/s "
                f"H2D, {row['d2h_gbps']:.3g} GB/s D2H, below {fraction:g} x its link's "
                f"{rate:.3g} GB/s ({row.get('link')})",
                hint="check the link (nvidia-smi -q -d PCIE; lspci -vv for its width and "
                "speed), the slot and riser, and that the rank runs on its GPU's NUMA node",
                subject=names[rank].subject))
    if unknown:
        findings.append(skip(check, "PCIe link rate unknown (sysfs has no link speed/width) "
                             f"for rank(s) {', '.join(map(str, unknown))}"))
    checked = len(rows) - len(unknown)
    if checked and not any(f.status.value == "WARN" for f in findings):
        findings.append(ok(check, f"{checked} rank(s) copy at or above {fraction:g} x their "
                           "PCIe link's rate"))
    return findings
