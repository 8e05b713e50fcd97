"""The stress results (from `stress_worker`, complete or partial) as report sections:
setup and ranks, GEMM, memory bandwidth here; the burn-in in gpucheck.stress.sdc_section,
host and peer copies in gpucheck.stress.copy_sections."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.distributed.nodes import group_by_node
from gpucheck.faults import gpu_names, run_faults_section, slowdown_causes
from gpucheck.measured import attach
from gpucheck.numa import cpulist, on_node, parse_cpulist
from gpucheck.records import as_dict, readable
from gpucheck.report import Finding, Section, ok, skip, warn
from gpucheck.stress.copy_sections import copies_section, p2p_section
from gpucheck.stress.metrics import stress_metrics
from gpucheck.stress.p2p_verdicts import p2p_findings as p2p_findings  # re-exported
from gpucheck.stress.power import power_findings, reach
from gpucheck.stress.records import (
    CopyRecord,
    GemmRecord,
    StressRank,
    StressRecords,
    read_back,
    read_stress,
)
from gpucheck.stress.sdc_section import sdc_section
from gpucheck.stress.specs import COPY_COUNTED, Figure, copy_figure, gemm_figure
from gpucheck.stress.verdicts import Again, expected_findings, peer_findings, subjects
from gpucheck.unread import unread_findings


@dataclass(frozen=True)
class Verdicts:
    """The thresholds the user chose (fractions in (0, 1])."""

    peer_fraction: float
    expected_fraction: float
    copy_fraction: float


def stress_sections(result: Mapping[str, Any], verdicts: Verdicts) -> list[Section]:
    """Setup and ranks, then one section per phase that ran (in the order they ran),
    then the hardware faults seen during the run. Every rank's record is read back
    first (gpucheck.stress.records): one that does not read is named, never judged."""
    if "ranks" not in result:  # failed before the first phase: rank 0's fault watch only
        return [faults_of(result)]
    records = read_stress(result)
    sections = [_setup_section(result, records)]
    done = result.get("phases_done") or []
    if records.gemm:
        sections.append(_gemm_section(result, records, verdicts, _causes(result)))
    if records.membw:
        sections.append(_membw_section(result, records, verdicts, _causes(result)))
    if result.get("sdc") and records.sdc:
        sections.append(sdc_section(result["sdc"], records, verdicts.peer_fraction,
                                    _causes(result)))
    if "copies" in done and result.get("copies"):
        sections.append(copies_section(result["copies"], records, verdicts.peer_fraction,
                                       verdicts.copy_fraction))
    if "p2p" in done and result.get("p2p"):
        sections.append(p2p_section(result["p2p"], records, verdicts.copy_fraction))
    sections.append(faults_of(result, records))
    # stress.<phase>.*: the phase's section; the records that read, as the verdicts.
    attach(sections, stress_metrics(read_back(result, records)), {})
    return sections


def faults_of(result: Mapping[str, Any], records: StressRecords | None = None) -> Section:
    """Hardware faults during the run: every rank's watch, or (a failed run) rank 0's."""
    entries = (records or read_stress(result)).entries
    return run_faults_section(result.get("faults") or [], [int(r["rank"]) for r in entries],
                              gpu_names(entries))


def _causes(result: Mapping[str, Any]) -> dict[int, str]:
    """Rank -> the clock slowdown its fault watch saw, for the slow-rank WARNs."""
    return slowdown_causes(result.get("faults") or [], window="measured phases")


def _setup_section(result: Mapping[str, Any], records: StressRecords) -> Section:
    keep = ("rank", "node_rank", "host", "local_rank", "device", "gpu", "cpus", "numa_node",
            "on_gpu_numa_node", "pinned", "threads", "pid")
    ranks = [{k: r.get(k) for k in keep} for r in records.entries]
    done, planned = result.get("phases_done") or [], result.get("phases_planned") or []
    data = {"world_size": result["world_size"], "nodes": len(group_by_node(records.entries)),
            "device": result["device"], "backend": result["backend"],
            "dtypes": result["dtypes"], "size": result["size"],
            "burn_in_s": result["duration_s"],
            "phases_done": f"{len(done)} of {len(planned)}: {', '.join(done) or 'none'}",
            "complete": result.get("complete", False), "ranks": ranks}
    findings = _numa_findings(records) + unread_findings("stress.rank_record", records.unread)
    return Section("stress", "Stress: setup and ranks", data, findings)


def _numa_findings(records: StressRecords) -> list[Finding]:
    """A WARN per rank with none of its CPUs on its GPU's NUMA node (as `ranks.numa`
    judges bench and comm); a rank spanning nodes is unpinned (--no-numa-pin, or the
    launcher's cpuset), the scheduler's choice and not a fault: said in the OK."""
    ranks = records.ranks
    names = subjects(records.entries)
    if all(r.gpu_name is None for r in ranks):
        return [skip("stress.numa", "CPU ranks: no GPU NUMA node to be near")]
    off = [r for r in ranks if r.on_gpu_numa_node is False and _none_near(r)]
    unknown = [r.rank for r in ranks if r.on_gpu_numa_node is None]
    findings = [warn("stress.numa", f"{names[r.rank].label} runs on CPUs {r.cpus}, "
                     f"none of them on its GPU's NUMA node {r.numa_node} "
                     f"(CPUs {r.gpu_cpus})",
                     hint="bind each rank to its GPU's NUMA node (srun --cpu-bind, numactl "
                     "--cpunodebind), or widen the job's cpuset to the GPU's CPUs so that "
                     "gpucheck can pin it: host copies and launches cross the CPU "
                     "interconnect otherwise",
                     subject=names[r.rank].subject) for r in off]
    if unknown:
        findings.append(skip("stress.numa", "the GPU's NUMA node is not known (sysfs) for "
                             f"rank(s) {', '.join(map(str, unknown))}"))
    near = len(ranks) - len(off) - len(unknown)
    if near and not off:
        findings.append(ok("stress.numa", _near_message(ranks, near)))
    return findings


def _none_near(rank: StressRank) -> bool:
    """None of the rank's CPUs is local to its GPU (`gpucheck.numa.on_node`'s rule)."""
    return on_node(parse_cpulist(rank.cpus), parse_cpulist(rank.gpu_cpus)) is False


def _near_message(ranks: Sequence[StressRank], near: int) -> str:
    pinned = sum(1 for r in ranks if r.pinned)
    spanning = [r.rank for r in ranks if r.on_gpu_numa_node is False]
    message = f"{near} rank(s) run on their GPU's NUMA node ({pinned} pinned there by gpucheck)"
    if spanning:
        message += (f"; rank(s) {cpulist(tuple(spanning))} also on other nodes' CPUs (not "
                     "pinned: --no-numa-pin or the launcher's binding)")
    return message


def _vs_peers(values: Mapping[int, float], ranks: Sequence[Mapping[str, Any]],
              ) -> dict[int, float]:
    """Each rank's figure / its node's median (rounded for the table)."""
    ratio = {}
    for members in group_by_node(ranks).values():
        mine = [values[m] for m in members if m in values]
        median = statistics.median(mine) if mine else 0.0
        for m in members:
            if m in values and median > 0:
                ratio[m] = round(values[m] / median, 3)
    return ratio


def again(values: Mapping[int, float]) -> Again | None:
    """The second measurement's figures per rank; None when there was none."""
    return Again(dict(values)) if values else None


def _gemm_section(result: Mapping[str, Any], records: StressRecords, verdicts: Verdicts,
                  causes: Mapping[int, str]) -> Section:
    ranks, findings = records.entries, []
    models = {r.rank: r.gpu_name for r in records.ranks}
    table = []
    for dtype in dict.fromkeys(r.dtype for r in records.gemm):
        mine = [r for r in records.gemm if r.dtype == dtype]
        values = {r.rank: float(r.tflops_p50) for r in mine}
        peers = _vs_peers(values, ranks)
        for r in mine:
            figure = gemm_figure(models.get(r.rank), dtype)
            table.append(as_dict(r) | {
                "vs_peers": peers.get(r.rank),
                "expected_tflops": round(figure.typical, 1) if figure else None,
                "vs_expected": round(r.tflops_p50 / figure.typical, 3) if figure else None})
        what = f"{dtype} GEMM {mine[0].size}^3"
        second = again({r.rank: float(r.tflops_p50) for r in records.gemm_again
                        if r.dtype == dtype})
        findings += peer_findings("stress.gemm.peers", what, "TFLOP/s", values, ranks,
                                  verdicts.peer_fraction, causes=causes, again=second)
        findings += expected_findings("stress.gemm.expected", what, "TFLOP/s", values, ranks,
                                      _gemm_figure_of(dtype),
                                      verdicts.expected_fraction, second)
    # Which column the verdicts judge: the median product's rate, not the mean `tflops`.
    data = {"flops_per_product": "2 n^3", "judged": "tflops_p50", **_thresholds(verdicts),
            "results": table}
    if records.gemm_again:  # as sent: each row says the suspects it was measured for
        data["measured again"] = readable(GemmRecord, result.get("gemm_again"))
    if records.power is not None:
        data["power under load (W)"] = [
            as_dict(r) | {"reach": round(x, 3) if (x := reach(r)) else None}
            for r in records.power]
        labels = {rank: s.label for rank, s in subjects(ranks).items()}
        findings += power_findings(records.power, ranks, labels)
    return Section("gemm", "Matrix multiply throughput per rank (TFLOP/s; verdicts use the "
                   "median product)", data, findings)


def _gemm_figure_of(dtype: str) -> Callable[[str | None], Figure | None]:
    """The typical figure of a GPU model for `dtype` (None for a model not listed)."""
    return lambda model: gemm_figure(model, dtype)


def _thresholds(verdicts: Verdicts) -> dict[str, float]:
    """The fractions the verdicts used, kept in the data so charts (and readers) use
    the same: a rank is flagged below peer_threshold x its node's median (vs_peers)
    or expected_threshold x its model's typical figure (vs_expected)."""
    return {"peer_threshold": verdicts.peer_fraction,
            "expected_threshold": verdicts.expected_fraction}


def _membw_section(result: Mapping[str, Any], records: StressRecords, verdicts: Verdicts,
                   causes: Mapping[int, str]) -> Section:
    ranks = records.entries
    models = {r.rank: r.gpu_name for r in records.ranks}
    values = {r.rank: float(r.gbps_p50) for r in records.membw}
    peers = _vs_peers(values, ranks)
    table = []
    for r in records.membw:
        figure = copy_figure(models.get(r.rank))
        table.append(as_dict(r) | {
            "vs_peers": peers.get(r.rank),
            "expected_gbps": round(figure.typical) if figure else None,
            "vs_expected": round(r.gbps_p50 / figure.typical, 3) if figure else None})
    what = "device memory copy"
    second = again({r.rank: float(r.gbps_p50) for r in records.membw_again})
    findings = peer_findings("stress.membw.peers", what, "GB/s", values, ranks,
                             verdicts.peer_fraction, causes=causes, again=second)
    findings += expected_findings("stress.membw.expected", what, "GB/s", values, ranks,
                                  copy_figure, verdicts.expected_fraction, second)
    data = {"counted": COPY_COUNTED, "judged": "gbps_p50", **_thresholds(verdicts),
            "results": table}
    if records.membw_again:
        data["measured again"] = readable(CopyRecord, result.get("membw_again"))
    return Section("membw", "Device memory bandwidth per rank (GB/s)", data, findings)
