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
from gpucheck.report import Finding, Section, ok, skip, warn
from gpucheck.stress.copy_sections import copies_section, p2p_section
from gpucheck.stress.metrics import stress_metrics
from gpucheck.stress.p2p_verdicts import p2p_findings as p2p_findings  # re-exported
from gpucheck.stress.power import power_findings, reach
from gpucheck.stress.sdc_section import sdc_section
from gpucheck.stress.specs import COPY_COUNTED, Figure, copy_figure, gemm_figure
from gpucheck.stress.verdicts import again_of, expected_findings, peer_findings, subjects


@dataclass(frozen=True)
class Verdicts:
    """The thresholds the user chose (fractions in (0, 1])."""

    peer_fraction: float
    expected_fraction: float
    copy_fraction: float


def stress_sections(result: Mapping[str, Any], verdicts: Verdicts) -> list[Section]:
    """Setup and ranks, then one section per phase that ran (in the order they ran),
    then the hardware faults seen during the run."""
    if "ranks" not in result:  # failed before the first phase: rank 0's fault watch only
        return [faults_of(result)]
    sections = [_setup_section(result)]
    done = result.get("phases_done") or []
    if result.get("gemm"):
        sections.append(_gemm_section(result, verdicts))
    if result.get("membw"):
        sections.append(_membw_section(result, verdicts))
    if result.get("sdc"):
        sections.append(sdc_section(result, verdicts.peer_fraction, _causes(result)))
    if "copies" in done and result.get("copies"):
        sections.append(copies_section(result, verdicts.peer_fraction, verdicts.copy_fraction))
    if "p2p" in done and result.get("p2p"):
        sections.append(p2p_section(result, verdicts.copy_fraction))
    sections.append(faults_of(result))
    attach(sections, stress_metrics(result), {})  # stress.<phase>.*: the phase's section
    return sections


def faults_of(result: Mapping[str, Any]) -> Section:
    """Hardware faults during the run: every rank's watch, or (a failed run) rank 0's."""
    ranks = result.get("ranks") or []
    return run_faults_section(result.get("faults") or [], [int(r["rank"]) for r in ranks],
                              gpu_names(ranks))


def _causes(result: Mapping[str, Any]) -> dict[int, str]:
    """Rank -> the clock slowdown its fault watch saw, for the slow-rank WARNs."""
    return slowdown_causes(result.get("faults") or [], window="measured phases")


def _setup_section(result: Mapping[str, Any]) -> Section:
    keep = ("rank", "node_rank", "host", "local_rank", "device", "gpu", "cpus", "numa_node",
            "on_gpu_numa_node", "pinned", "threads", "pid")
    ranks = [{k: r.get(k) for k in keep} for r in result["ranks"]]
    done, planned = result.get("phases_done") or [], result.get("phases_planned") or []
    data = {"world_size": result["world_size"], "nodes": len(group_by_node(result["ranks"])),
            "device": result["device"], "backend": result["backend"],
            "dtypes": result["dtypes"], "size": result["size"],
            "burn_in_s": result["duration_s"],
            "phases_done": f"{len(done)} of {len(planned)}: {', '.join(done) or 'none'}",
            "complete": result.get("complete", False), "ranks": ranks}
    return Section("stress", "Stress: setup and ranks", data, _numa_findings(result["ranks"]))


def _numa_findings(ranks: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A WARN per rank with none of its CPUs on its GPU's NUMA node (as `ranks.numa`
    judges bench and comm); a rank spanning nodes is unpinned (--no-numa-pin, or the
    launcher's cpuset), the scheduler's choice and not a fault: said in the OK."""
    names = subjects(ranks)
    if all(r.get("gpu_name") is None for r in ranks):
        return [skip("stress.numa", "CPU ranks: no GPU NUMA node to be near")]
    off = [r for r in ranks if r.get("on_gpu_numa_node") is False and _none_near(r)]
    unknown = [int(r["rank"]) for r in ranks if r.get("on_gpu_numa_node") is None]
    findings = [warn("stress.numa", f"{names[int(r['rank'])].label} runs on CPUs {r['cpus']}, "
                     f"none of them on its GPU's NUMA node {r['numa_node']} "
                     f"(CPUs {r['gpu_cpus']})",
                     hint="bind each rank to its GPU's NUMA node (srun --cpu-bind, numactl "
                     "--cpunodebind), or widen the job's cpuset to the GPU's CPUs so that "
                     "gpucheck can pin it: host copies and launches cross the CPU "
                     "interconnect otherwise",
                     subject=f"rank {r['rank']}") for r in off]
    if unknown:
        findings.append(skip("stress.numa", "the GPU's NUMA node is not known (sysfs) for "
                             f"rank(s) {', '.join(map(str, unknown))}"))
    near = len(ranks) - len(off) - len(unknown)
    if near and not off:
        findings.append(ok("stress.numa", _near_message(ranks, near)))
    return findings


def _none_near(rank: Mapping[str, Any]) -> bool:
    """None of the rank's CPUs is local to its GPU (`gpucheck.numa.on_node`'s rule)."""
    return on_node(parse_cpulist(rank.get("cpus")), parse_cpulist(rank.get("gpu_cpus"))) is False


def _near_message(ranks: Sequence[Mapping[str, Any]], near: int) -> str:
    pinned = sum(1 for r in ranks if r.get("pinned"))
    spanning = [int(r["rank"]) for r in ranks if r.get("on_gpu_numa_node") is False]
    message = f"{near} rank(s) run on their GPU's NUMA node ({pinned} pinned there by gpucheck)"
    if spanning:
        message += (f"; rank(s) {cpulist(tuple(spanning))} also on other nodes' CPUs (not "
                     "pinned: --no-numa-pin or the launcher's binding)")
    return message


def _vs_peers(rows: list[dict[str, Any]], key: str, ranks: Sequence[Mapping[str, Any]],
              ) -> dict[int, float]:
    """Each rank's `key` / its node's median (rounded for the table)."""
    value = {int(r["rank"]): float(r[key]) for r in rows}
    ratio = {}
    for members in group_by_node(ranks).values():
        mine = [value[m] for m in members if m in value]
        median = statistics.median(mine) if mine else 0.0
        for m in members:
            if m in value and median > 0:
                ratio[m] = round(value[m] / median, 3)
    return ratio


def _gemm_section(result: Mapping[str, Any], verdicts: Verdicts) -> Section:
    ranks, rows, findings = result["ranks"], list(result["gemm"]), []
    models = {int(r["rank"]): r.get("gpu_name") for r in ranks}
    table = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype]
        peers = _vs_peers(mine, "tflops_p50", ranks)
        for r in mine:
            figure = gemm_figure(models.get(int(r["rank"])), dtype)
            table.append(r | {"vs_peers": peers.get(int(r["rank"])),
                              "expected_tflops": round(figure.typical, 1) if figure else None,
                              "vs_expected": round(r["tflops_p50"] / figure.typical, 3)
                              if figure else None})
        values = {int(r["rank"]): float(r["tflops_p50"]) for r in mine}
        what = f"{dtype} GEMM {mine[0]['size']}^3"
        again = again_of(result.get("gemm_again"), "tflops_p50", dtype)
        findings += peer_findings("stress.gemm.peers", what, "TFLOP/s", values, ranks,
                                  verdicts.peer_fraction, causes=_causes(result), again=again)
        findings += expected_findings("stress.gemm.expected", what, "TFLOP/s", values, ranks,
                                      _gemm_figure_of(dtype),
                                      verdicts.expected_fraction, again)
    # Which column the verdicts judge: the median product's rate, not the mean `tflops`.
    data = {"flops_per_product": "2 n^3", "judged": "tflops_p50", **_thresholds(verdicts),
            "results": table}
    if result.get("gemm_again"):
        data["measured again"] = list(result["gemm_again"])
    if result.get("power") is not None:  # older reports have no power readings
        power = list(result["power"])
        data["power under load (W)"] = [r | {"reach": round(x, 3) if (x := reach(r)) else None}
                                        for r in power]
        labels = {rank: s.label for rank, s in subjects(ranks).items()}
        findings += power_findings(power, ranks, labels)
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


def _membw_section(result: Mapping[str, Any], verdicts: Verdicts) -> Section:
    ranks, rows = result["ranks"], list(result["membw"])
    models = {int(r["rank"]): r.get("gpu_name") for r in ranks}
    peers = _vs_peers(rows, "gbps_p50", ranks)
    table = []
    for r in rows:
        figure = copy_figure(models.get(int(r["rank"])))
        table.append(r | {"vs_peers": peers.get(int(r["rank"])),
                          "expected_gbps": round(figure.typical) if figure else None,
                          "vs_expected": round(r["gbps_p50"] / figure.typical, 3)
                          if figure else None})
    values = {int(r["rank"]): float(r["gbps_p50"]) for r in rows}
    what = "device memory copy"
    again = again_of(result.get("membw_again"), "gbps_p50")
    findings = peer_findings("stress.membw.peers", what, "GB/s", values, ranks,
                             verdicts.peer_fraction, causes=_causes(result), again=again)
    findings += expected_findings("stress.membw.expected", what, "GB/s", values, ranks,
                                  copy_figure, verdicts.expected_fraction, again)
    data = {"counted": COPY_COUNTED, "judged": "gbps_p50", **_thresholds(verdicts),
            "results": table}
    if result.get("membw_again"):
        data["measured again"] = list(result["membw_again"])
    return Section("membw", "Device memory bandwidth per rank (GB/s)", data, findings)
