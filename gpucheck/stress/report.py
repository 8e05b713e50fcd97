"""The stress results (complete or partial) as report sections: setup and ranks, GEMM,
memory bandwidth, host and peer copies (the burn-in's: `sdc_section`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subject_
from gpucheck.distributed.nodes import group_by_node
from gpucheck.faults import gpu_names, run_faults_section, slowdown_causes
from gpucheck.measure import attach
from gpucheck.numa import cpulist, on_node, parse_cpulist
from gpucheck.records import as_dict, readable
from gpucheck.report import Finding, Section, ok, skip, unread_findings, warn
from gpucheck.stress.gemm import (
    COPY_COUNTED,
    Figure,
    copy_figure,
    gemm_figure,
    power_findings,
    reach,
)
from gpucheck.stress.records import (
    CopyRecord,
    GemmRecord,
    StressRecords,
    read_stress,
    stress_metrics,
)
from gpucheck.stress.sdc_section import sdc_section
from gpucheck.stress.verdicts import (
    again_of,
    copies_again,
    expected_findings,
    link_findings,
    p2p_findings,
    peer_findings,
    subjects,
)


@dataclass(frozen=True)
class Verdicts:
    """The thresholds the user chose (fractions in (0, 1])."""

    peer_fraction: float
    expected_fraction: float
    copy_fraction: float


def stress_sections(result: Mapping[str, Any], verdicts: Verdicts) -> list[Section]:
    """Setup and ranks, one section per phase that ran, then the hardware faults. A
    rank's record that does not read back is named, never judged."""
    if "ranks" not in result:  # failed before the first phase: rank 0's fault watch only
        return [faults_of(result)]
    records = read_stress(result)
    sections = [_setup_section(result, records)]
    done = result.get("phases_done") or []
    # Rank -> the clock slowdown its fault watch saw, for the slow-rank WARNs.
    causes = slowdown_causes(result.get("faults") or [], window="measured phases")
    if records.gemm:
        sections.append(_gemm_section(result, records, verdicts, causes))
    if records.membw:
        sections.append(_membw_section(result, records, verdicts, causes))
    if result.get("sdc") and records.sdc:
        sections.append(sdc_section(result["sdc"], records, verdicts.peer_fraction, causes))
    if "copies" in done and result.get("copies"):
        sections.append(copies_section(result["copies"], records, verdicts.peer_fraction,
                                       verdicts.copy_fraction))
    if "p2p" in done and result.get("p2p"):
        sections.append(p2p_section(result["p2p"], records, verdicts.copy_fraction))
    sections.append(faults_of(result, records))
    # stress.<phase>.*: the phase's section; the records that read, as the verdicts.
    attach(sections, stress_metrics(records), {})
    return sections


def faults_of(result: Mapping[str, Any], records: StressRecords | None = None) -> Section:
    """Hardware faults during the run: every rank's watch, or (a failed run) rank 0's."""
    entries = (records or read_stress(result)).entries
    return run_faults_section(result.get("faults") or [], [int(r["rank"]) for r in entries],
                              gpu_names(entries))


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
    """A WARN per rank with none of its CPUs on its GPU's NUMA node; one spanning nodes
    is unpinned (the scheduler's choice, not a fault): said in the OK."""
    ranks = records.ranks
    names = subjects(records.entries)
    if all(r.gpu_name is None for r in ranks):
        return [skip("stress.numa", "CPU ranks: no GPU NUMA node to be near")]
    off = [r for r in ranks if r.on_gpu_numa_node is False
           and on_node(parse_cpulist(r.cpus), parse_cpulist(r.gpu_cpus)) is False]
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
        pinned = sum(1 for r in ranks if r.pinned)
        spanning = [r.rank for r in ranks if r.on_gpu_numa_node is False]
        findings.append(ok("stress.numa", f"{near} rank(s) run on their GPU's NUMA node "
                           f"({pinned} pinned there by gpucheck)" + (
                               f"; rank(s) {cpulist(tuple(spanning))} also on other nodes' "
                               "CPUs (not pinned: --no-numa-pin or the launcher's binding)"
                               if spanning else "")))
    return findings


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


def _judged(check: str, what: str, unit: str, rows: Sequence[Any], key: str,
            again_rows: Sequence[Any], records: StressRecords, verdicts: Verdicts,
            causes: Mapping[int, str], figure_of: Callable[[str | None], Figure | None],
            expected: tuple[str, int | None]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The table rows (with vs_peers and vs_expected) and the peer and expected findings
    of one figure (`key`) of `rows`; `expected`: the expected column and its rounding."""
    ranks, models = records.entries, {r.rank: r.gpu_name for r in records.ranks}
    values = {r.rank: float(getattr(r, key)) for r in rows}
    peers, table = _vs_peers(values, ranks), []
    for r in rows:
        figure = figure_of(models.get(r.rank))
        table.append(as_dict(r) | {
            "vs_peers": peers.get(r.rank),
            expected[0]: round(figure.typical, expected[1]) if figure else None,
            "vs_expected": round(values[r.rank] / figure.typical, 3) if figure else None})
    second = again_of([as_dict(r) for r in again_rows], key)
    findings = peer_findings(f"{check}.peers", what, unit, values, ranks,
                             verdicts.peer_fraction, causes=causes, again=second)
    findings += expected_findings(f"{check}.expected", what, unit, values, ranks, figure_of,
                                  verdicts.expected_fraction, second)
    return table, findings


def _gemm_section(result: Mapping[str, Any], records: StressRecords, verdicts: Verdicts,
                  causes: Mapping[int, str]) -> Section:
    findings: list[Finding] = []
    table: list[dict[str, Any]] = []
    for dtype in dict.fromkeys(r.dtype for r in records.gemm):
        mine = [r for r in records.gemm if r.dtype == dtype]

        def figure_of(model: str | None, dtype: str = dtype) -> Figure | None:
            return gemm_figure(model, dtype)

        rows, found = _judged("stress.gemm", f"{dtype} GEMM {mine[0].size}^3", "TFLOP/s",
                              mine, "tflops_p50",
                              [r for r in records.gemm_again if r.dtype == dtype], records,
                              verdicts, causes, figure_of,
                              ("expected_tflops", 1))
        table += rows
        findings += found
    # Which column the verdicts judge: the median product's rate, not the mean `tflops`.
    data = {"flops_per_product": "2 n^3", "judged": "tflops_p50", **_thresholds(verdicts),
            "results": table}
    if records.gemm_again:  # as sent: each row says the suspects it was measured for
        data["measured again"] = readable(GemmRecord, result.get("gemm_again"))
    if records.power is not None:
        data["power under load (W)"] = [
            as_dict(r) | {"reach": round(x, 3) if (x := reach(r)) else None}
            for r in records.power]
        labels = {rank: s.label for rank, s in subjects(records.entries).items()}
        findings += power_findings(records.power, records.entries, labels)
    return Section("gemm", "Matrix multiply throughput per rank (TFLOP/s; verdicts use the "
                   "median product)", data, findings)


def _thresholds(verdicts: Verdicts) -> dict[str, float]:
    """The fractions the verdicts used, in the data so that charts use the same."""
    return {"peer_threshold": verdicts.peer_fraction,
            "expected_threshold": verdicts.expected_fraction}


def _membw_section(result: Mapping[str, Any], records: StressRecords, verdicts: Verdicts,
                   causes: Mapping[int, str]) -> Section:
    table, findings = _judged("stress.membw", "device memory copy", "GB/s", records.membw,
                              "gbps_p50", records.membw_again, records, verdicts, causes,
                              copy_figure, ("expected_gbps", None))
    data = {"counted": COPY_COUNTED, "judged": "gbps_p50", **_thresholds(verdicts),
            "results": table}
    if records.membw_again:
        data["measured again"] = readable(CopyRecord, result.get("membw_again"))
    return Section("membw", "Device memory bandwidth per rank (GB/s)", data, findings)


def copies_section(copies: Mapping[str, Any], records: StressRecords, peer_fraction: float,
                   copy_fraction: float) -> Section:
    """Host copies alone against each link, all at once against the node's peers."""
    ranks = records.entries
    if "skipped" in copies:
        return Section("copies", "Host<->device copies (pinned memory)", {},
                       [skip("stress.copies", str(copies["skipped"]))])
    rows = records.copies
    alone = [{"rank": r.rank, "h2d_gbps": r.h2d_alone_gbps, "d2h_gbps": r.d2h_alone_gbps,
              "link": r.link, "link_gbps": r.link_gbps}
             for r in rows if r.h2d_alone_gbps is not None]
    again = [as_dict(r) for r in records.copies_again or ()]
    findings = link_findings("stress.copies.link", alone, ranks, copy_fraction,
                             copies_again(again, "alone"))
    together = {r.rank: min(r.h2d_together_gbps, r.d2h_together_gbps) for r in rows}
    findings += peer_findings("stress.copies.together", "host copies with every GPU at once "
                              "(slower direction)", "GB/s", together, ranks,
                              peer_fraction, again=copies_again(again, "together"))
    table = [as_dict(r) | {"together_vs_alone": None if not r.h2d_alone_gbps or not
                           r.d2h_alone_gbps else round(min(
                               r.h2d_together_gbps / r.h2d_alone_gbps,
                               r.d2h_together_gbps / r.d2h_alone_gbps), 3)} for r in rows]
    data: dict[str, Any] = {"counted": "bytes one way / median copy time (one PCIe direction)",
                            "results": table}
    if again:
        data["measured again"] = again
    return Section("copies", "Host<->device copies (pinned memory): each GPU alone, then "
                   "all at once (GB/s)", data, findings)


def p2p_section(p2p: Mapping[str, Any], records: StressRecords,
                copy_fraction: float) -> Section:
    """`p2p`: the phase's result; `records`: each node's matrix as read back."""
    title = "Peer-to-peer copies between GPUs (GB/s, src row -> dst column)"
    if "skipped" in p2p:
        return Section("p2p", title, {}, [skip("stress.p2p", str(p2p["skipped"]))])
    data: dict[str, Any] = {}
    findings: list[Finding] = []
    for node in records.p2p_nodes:
        where = subject_.node(int(node["node_rank"]), f"node {node['node_rank']} ({node['host']})",
                              host=str(node["host"]))
        if "skipped" in node:
            findings.append(skip("stress.p2p", f"{where}: {node['skipped']}", subject=where))
            continue
        data[f"{where} matrix"] = _p2p_matrix(node)
        data[f"{where} path classes"] = _path_classes(node)
        findings += p2p_findings(node, where, copy_fraction)
    return Section("p2p", title, data, findings)


def _path_classes(node: Mapping[str, Any]) -> list[dict[str, Any]] | str:
    """Per path class (`nvidia-smi topo -m`): its pairs, how many have peer access and
    their median GB/s; or why the classes were not read (one class then)."""
    if node.get("paths_unread"):
        return str(node["paths_unread"])
    classes: dict[str, list[Mapping[str, Any]]] = {}
    for p in node["pairs"]:
        classes.setdefault(str(p.get("path") or "unknown"), []).append(p)
    rows = []
    for kind, pairs in sorted(classes.items()):
        rates = [p["gbps"] for p in pairs if p["gbps"] is not None]
        rows.append({"path": kind, "pairs": len(pairs), "with_p2p": len(rates),
                     "median_gbps": round(statistics.median(rates), 1) if rates else None,
                     "p2p_status": sorted({str(p.get("p2p_status")) for p in pairs})})
    return rows


def _p2p_matrix(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    count = len(node["gpus"])
    cell = {(p["src"], p["dst"]): p for p in node["pairs"]}
    rows = []
    for src in range(count):
        index = node["gpus"][src].get("nvml_index")
        row: dict[str, Any] = {"src": f"cuda:{src} ("
                               + ("?" if index is None else f"GPU {index}") + ")"}
        for dst in range(count):
            pair = cell.get((src, dst))
            row[f"to cuda:{dst}"] = None if pair is None else (
                round(pair["gbps"], 1) if pair["gbps"] is not None else "no P2P")
        rows.append(row)
    return rows

