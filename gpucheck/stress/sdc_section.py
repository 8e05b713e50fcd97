"""The burn-in's section: each rank's repeats against its first product, the ranks
against each other and the fp64 CPU reference (`agreement.judge`), and its straggler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck import subject as subjects_
from gpucheck.agreement import beyond, judge
from gpucheck.numa import cpulist
from gpucheck.records import as_dict
from gpucheck.report import Finding, Section, fail, ok, warn
from gpucheck.stress.records import BurnRecord, StressRank, StressRecords
from gpucheck.stress.verdicts import Named, peer_findings, subjects

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
