"""The stress results (complete or partial) as report sections: setup and ranks, GEMM,
memory bandwidth, the burn-in (the copies' sections: `copies`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects_
from gpucheck.agreement import beyond, judge
from gpucheck.distributed.nodes import group_by_node
from gpucheck.faults import gpu_names, run_faults_section, slowdown_causes
from gpucheck.measure import attach
from gpucheck.numa import cpulist, on_node, parse_cpulist
from gpucheck.peers import against_median
from gpucheck.records import as_dict, readable
from gpucheck.report import Finding, Section, fail, ok, skip, unread_findings, warn
from gpucheck.stress.copies import copies_section, p2p_section
from gpucheck.stress.gemm import (
    COPY_COUNTED,
    Figure,
    copy_figure,
    gemm_figure,
    power_findings,
    reach,
)
from gpucheck.stress.records import (
    BurnRecord,
    CopyRecord,
    GemmRecord,
    StressRank,
    StressRecords,
    read_stress,
    stress_metrics,
)
from gpucheck.stress.verdicts import (
    Named,
    again_of,
    bound_of,
    expected_findings,
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


def _judged(check: str, what: str, unit: str, rows: Sequence[Any], key: str,
            again_rows: Sequence[Any], records: StressRecords, verdicts: Verdicts,
            causes: Mapping[int, str], figure_of: Callable[[str | None], Figure | None],
            expected: tuple[str, int | None]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The table rows (with vs_peers and vs_expected) and the peer and expected findings
    of one figure (`key`) of `rows`; `expected`: the expected column and its rounding."""
    ranks, models = records.entries, {r.rank: r.gpu_name for r in records.ranks}
    values = {r.rank: float(getattr(r, key)) for r in rows}
    peers: dict[int, float] = {}  # each rank's figure / its node's median
    for members in group_by_node(ranks).values():
        peers |= against_median({m: values[m] for m in members if m in values},
                                bound_of(1.0), min_count=1).ratios
    table = []
    for r in rows:
        figure = figure_of(models.get(r.rank))
        table.append(as_dict(r) | {
            "vs_peers": round(peers[r.rank], 3) if r.rank in peers else None,
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


BOUND_WORDS = "is {:.3g}x its per-element bound from the fp64 CPU reference (at most {:g})"


def sdc_section(sdc: Mapping[str, Any], records: StressRecords, peer_fraction: float,
                causes: Mapping[int, str]) -> Section:
    """`sdc`: rank 0's summary of the burn-in; `records`: every rank's, read back."""
    burns, ranks = records.sdc, records.entries
    deviations = records.sdc_deviations
    table = [{k: v for k, v in as_dict(r).items() if k != "group"} | {"reference_deviation": d}
             for r, d in zip(burns, deviations, strict=True)]
    findings = _repeat_findings(burns, ranks)
    findings += _agreement_findings(burns, deviations, sdc["tolerance"], records,
                                    sdc.get("coverage") or f"{sdc['rows_checked']} rows")
    times = {r.rank: float(r.p50_ms) for r in burns}
    groups: dict[str, list[int]] = {}  # which ranks were compared bit for bit
    for r in burns:
        groups.setdefault(r.group, []).append(r.rank)
    findings += peer_findings("stress.sdc.straggler", "median burn-in product time", "ms",
                              times, ranks, peer_fraction, higher_is_better=False,
                              causes=causes,
                              again={r.rank: float(r.p50_ms) for r in records.sdc_again}
                              or None)
    data = {"dtype": sdc["dtype"], "size": sdc["size"], "burn_in_s": sdc["duration_s"],
            "tolerance_vs_reference": sdc["tolerance"], "rows_vs_reference": sdc["rows_checked"],
            "reference": sdc.get("reference"),
            "reference_coverage": sdc.get("coverage"), "rows_seed": sdc.get("rows_seed"),
            "kernel_groups": [{"group": g, "ranks": cpulist(tuple(sorted(m)))}
                              for g, m in groups.items()], "results": table}
    if records.sdc_again:
        data["measured again"] = [{"rank": r.rank, "iters": r.iters, "p50_ms": r.p50_ms,
                                   "p99_ms": r.p99_ms} for r in records.sdc_again]
    return Section("sdc", "Silent data corruption: the same product, repeated and compared",
                   data, findings)


def _repeat_findings(records: Sequence[BurnRecord],
                     ranks: Sequence[Mapping[str, Any]]) -> list[Finding]:
    findings = []
    for r in records:
        if not r.bad_iters:
            continue
        how = (f"up to {r.worst_elements} element(s) differed bitwise" if r.mode ==
               "bitwise" else "beyond the dtype's tolerance")
        findings.append(fail(
            "stress.sdc.repeat", f"{_named(ranks, r.rank).label}: the same product on the "
            f"same inputs gave a different result in {r.bad_iters} of {r.iters} "
            f"repetitions (first at repetition {r.first_bad_iter}; {how})",
            hint="this GPU computes wrong results under load: drain it, check nvidia-smi -q "
            "(ECC errors, retired/remapped rows, XIDs in dmesg) and run the vendor's "
            "diagnostics (dcgmi diag -r 3) before it returns to service",
            subject=_named(ranks, r.rank).subject))
    if not findings:
        total = sum(r.iters for r in records)
        modes = sorted({r.mode for r in records})
        findings.append(ok("stress.sdc.repeat", f"all {len(records)} rank(s) repeated their "
                           f"first result exactly ({'/'.join(modes)}) over {total} products"))
    return findings


def _agreement_findings(records: Sequence[BurnRecord],
                        deviations: Sequence[float | None], tolerance: float,
                        read: StressRecords, coverage: str) -> list[Finding]:
    """Ranks against each other (bitwise, by model) and against the CPU reference."""
    digests = {r.rank: r.digest for r in records}
    groups = {r.rank: r.group for r in records}
    deviation = {r.rank: d for r, d in zip(records, deviations, strict=True)}
    nodes = {r.rank: r.node_rank for r in read.ranks}
    verdict = judge(digests, deviation, tolerance, groups, nodes, splits=True,
                    measure=BOUND_WORDS)
    every_one = len(verdict.wrong) == len(records) > 1
    findings = [fail("stress.sdc.agreement", f"{_named(read.entries, rank).label}: {why}",
                     hint=("every rank disagrees with the reference alike: suspect the "
                           "software (torch, cuBLAS, driver), not one GPU") if every_one else
                     "this GPU computed a wrong product: drain it and run the vendor's "
                     "diagnostics (dcgmi diag -r 3); check ECC errors and XIDs",
                     subject=_named(read.entries, rank).subject,
                     cause="all_alike" if every_one else None)
                for rank, why in verdict.wrong.items()]
    findings += [_software_split(side, digests, groups, deviation, tolerance, read.ranks)
                 for side in verdict.software]
    if verdict.undecided:
        listed = ", ".join(f"rank {r}" for r in verdict.undecided)
        findings.append(warn(
            "stress.sdc.agreement", f"{listed} differ bitwise but all stay within the CPU "
            f"reference's tolerance ({tolerance:g}), and no majority names one",
            hint="rerun with more GPUs (a majority then names the odd one) or a longer "
            "--duration; repeated disagreement points at one of these GPUs",
            subject=subjects_.ranks(verdict.undecided, listed)))
    if not findings:
        checked = sum(1 for d in deviation.values() if d is not None)
        findings.append(ok("stress.sdc.agreement", f"all {len(records)} rank(s) agree "
                           f"bitwise (same model and libraries); {checked} with each element "
                           f"within its bound of the fp64 CPU reference on {coverage}"))
    return findings


def _software_split(side: Sequence[int], digests: Mapping[int, str], groups: Mapping[int, str],
                    deviation: Mapping[int, float | None], tolerance: float,
                    ranks: Sequence[StressRank]) -> Finding:
    """Ranks that agree among themselves (or fill whole nodes) against the rest of their
    group: a software difference, which the CPU reference settles (who is right)."""
    rest = [r for r in digests if groups.get(r) == groups.get(side[0]) and r not in side]
    hosts = sorted({f"node {r.node_rank} ({r.host})" for r in ranks if r.rank in side})
    listed = f"rank(s) {cpulist(tuple(side))}" + (f" on {', '.join(hosts)}" if hosts else "")
    return warn("stress.sdc.software_split",
                f"{listed} agree with each other (or fill whole nodes) but differ bitwise "
                f"from rank(s) {cpulist(tuple(sorted(rest))) or 'none'}: independent GPU "
                f"faults never agree, so this is a software split; CPU reference: "
                f"{_side_words(side, deviation, tolerance)} on this side, "
                f"{_side_words(rest, deviation, tolerance)} on the other",
                hint="make the nodes' software the same: compare gpucheck env across nodes "
                "(torch, CUDA, the cuBLAS loaded, CUBLAS_WORKSPACE_CONFIG, "
                "TORCH_BLAS_PREFER_CUBLASLT); the side beyond the reference's tolerance "
                "computes wrongly, both within it is a harmless difference",
                subject=subjects_.ranks(side, listed))


def _side_words(side: Sequence[int], deviation: Mapping[int, float | None],
                tolerance: float) -> str:
    """"within 2e-02" / "beyond 2e-02 (worst 0.4)" / "not compared" for one side."""
    values = [d for r in side if (d := deviation.get(r)) is not None]
    if not values:
        return "not compared"
    worst = max(values, key=lambda d: d if d == d else float("inf"))
    return f"beyond {tolerance:g} (worst {worst:.3g})" if beyond(worst, tolerance) else \
        f"within {tolerance:g} (worst {worst:.3g})"


def _named(ranks: Sequence[Mapping[str, Any]], rank: int) -> Named:
    """The rank as findings name it; "rank N" when its roll entry did not read."""
    return subjects(ranks).get(rank) or Named(rank, f"rank {rank}", subjects_.rank(rank))
