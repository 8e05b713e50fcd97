"""The stress results (from `stress_worker`, complete or partial) as report sections."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.distributed.nodes import group_by_node
from gpucheck.faults import gpu_names, run_faults_section, slowdown_causes
from gpucheck.measured import attach
from gpucheck.numa import cpulist, on_node, parse_cpulist
from gpucheck.report import Finding, Section, fail, ok, skip, warn
from gpucheck.stress.metrics import stress_metrics
from gpucheck.stress.p2p_verdicts import p2p_findings
from gpucheck.stress.power import power_findings, reach
from gpucheck.stress.sdc import BOUND_WORDS, beyond, judge
from gpucheck.stress.specs import COPY_COUNTED, Figure, copy_figure, gemm_figure
from gpucheck.stress.verdicts import (
    again_of,
    copies_again,
    expected_findings,
    link_findings,
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
        sections.append(_sdc_section(result, verdicts))
    if "copies" in done and result.get("copies"):
        sections.append(_copies_section(result, verdicts))
    if "p2p" in done and result.get("p2p"):
        sections.append(_p2p_section(result, verdicts))
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
    if result.get("power") is not None:  # None until every dtype's GEMM window ran
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


def _sdc_section(result: Mapping[str, Any], verdicts: Verdicts) -> Section:
    sdc, ranks = result["sdc"], result["ranks"]
    records = list(sdc["records"])
    deviations = sdc.get("reference_deviations") or [None] * len(records)
    table = [{k: v for k, v in r.items() if k != "group"} | {"reference_deviation": d}
             for r, d in zip(records, deviations, strict=True)]
    findings = _repeat_findings(records, ranks)
    findings += _agreement_findings(records, deviations, sdc["tolerance"], ranks,
                                    _reference_words(sdc))
    times = {int(r["rank"]): float(r["p50_ms"]) for r in records}
    findings += peer_findings("stress.sdc.straggler", "median burn-in product time", "ms",
                              times, ranks, verdicts.peer_fraction, higher_is_better=False,
                              causes=_causes(result),
                              again=again_of(result.get("sdc_again"), "p50_ms"))
    data = {"dtype": sdc["dtype"], "size": sdc["size"], "burn_in_s": sdc["duration_s"],
            "tolerance_vs_reference": sdc["tolerance"], "rows_vs_reference": sdc["rows_checked"],
            "reference": sdc.get("reference"),
            "reference_coverage": sdc.get("coverage"), "rows_seed": sdc.get("rows_seed"),
            "kernel_groups": _kernel_groups(records), "results": table}
    if result.get("sdc_again"):
        data["measured again"] = [{k: r[k] for k in ("rank", "iters", "p50_ms", "p99_ms")}
                                  for r in result["sdc_again"]]
    return Section("sdc", "Silent data corruption: the same product, repeated and compared",
                   data, findings)


def _reference_words(sdc: Mapping[str, Any]) -> tuple[str, str]:
    """(how a wrong rank's deviation reads, what the OK says was checked): each element
    against its bound (the worker's only reference, `gpucheck.stress.sdc`)."""
    return BOUND_WORDS, (f"each element within its bound of the fp64 CPU reference on "
                         f"{sdc.get('coverage') or str(sdc['rows_checked']) + ' rows'}")


def _kernel_groups(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Which ranks were compared bit for bit: one row per group key (model, SMs,
    torch, CUDA, the cuBLAS loaded and its settings)."""
    groups: dict[str, list[int]] = {}
    for r in records:
        groups.setdefault(str(r.get("group")), []).append(int(r["rank"]))
    return [{"group": g, "ranks": cpulist(tuple(sorted(m)))} for g, m in groups.items()]


def _repeat_findings(records: Sequence[Mapping[str, Any]],
                     ranks: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Each rank's later products against its own first one."""
    names = subjects(ranks)
    findings = []
    for r in records:
        if not r["bad_iters"]:
            continue
        how = (f"up to {r['worst_elements']} element(s) differed bitwise" if r["mode"] ==
               "bitwise" else "beyond the dtype's tolerance")
        findings.append(fail(
            "stress.sdc.repeat", f"{names[int(r['rank'])].label}: the same product on the "
            f"same inputs gave a different result in {r['bad_iters']} of {r['iters']} "
            f"repetitions (first at repetition {r['first_bad_iter']}; {how})",
            hint="this GPU computes wrong results under load: drain it, check nvidia-smi -q "
            "(ECC errors, retired/remapped rows, XIDs in dmesg) and run the vendor's "
            "diagnostics (dcgmi diag -r 3) before it returns to service",
            subject=f"rank {r['rank']}"))
    if not findings:
        total = sum(int(r["iters"]) for r in records)
        modes = sorted({r["mode"] for r in records})
        findings.append(ok("stress.sdc.repeat", f"all {len(records)} rank(s) repeated their "
                           f"first result exactly ({'/'.join(modes)}) over {total} products"))
    return findings


def _agreement_findings(records: Sequence[Mapping[str, Any]],
                        deviations: Sequence[float | None], tolerance: float,
                        ranks: Sequence[Mapping[str, Any]],
                        words: tuple[str, str]) -> list[Finding]:
    """Ranks against each other (bitwise, by model) and against the CPU reference."""
    names = subjects(ranks)
    digests = {int(r["rank"]): r["digest"] for r in records}
    groups = {int(r["rank"]): r["group"] for r in records}
    deviation = {int(r["rank"]): d for r, d in zip(records, deviations, strict=True)}
    nodes = {int(r["rank"]): int(r["node_rank"]) for r in ranks if "node_rank" in r}
    verdict = judge(digests, deviation, tolerance, groups, nodes, splits=True,
                    measure=words[0])
    every_one = len(verdict.wrong) == len(records) > 1
    findings = [fail("stress.sdc.agreement", f"{names[rank].label}: {why}",
                     hint=("every rank disagrees with the reference alike: suspect the "
                           "software (torch, cuBLAS, driver), not one GPU") if every_one else
                     "this GPU computed a wrong product: drain it and run the vendor's "
                     "diagnostics (dcgmi diag -r 3); check ECC errors and XIDs",
                     subject=f"rank {rank}", cause="all_alike" if every_one else None)
                for rank, why in verdict.wrong.items()]
    findings += [_software_split(side, digests, groups, deviation, tolerance, ranks)
                 for side in verdict.software]
    if verdict.undecided:
        listed = ", ".join(f"rank {r}" for r in verdict.undecided)
        findings.append(warn(
            "stress.sdc.agreement", f"{listed} differ bitwise but all stay within the CPU "
            f"reference's tolerance ({tolerance:g}), and no majority names one",
            hint="rerun with more GPUs (a majority then names the odd one) or a longer "
            "--duration; repeated disagreement points at one of these GPUs",
            subject=listed))
    if not findings:
        checked = sum(1 for d in deviation.values() if d is not None)
        findings.append(ok("stress.sdc.agreement", f"all {len(records)} rank(s) agree "
                           f"bitwise (same model and libraries); {checked} with {words[1]}"))
    return findings


def _software_split(side: Sequence[int], digests: Mapping[int, str], groups: Mapping[int, str],
                    deviation: Mapping[int, float | None], tolerance: float,
                    ranks: Sequence[Mapping[str, Any]]) -> Finding:
    """Ranks that agree among themselves (or fill whole nodes) against the rest of their
    group: a software difference, which the CPU reference settles (who is right)."""
    rest = [r for r in digests if groups.get(r) == groups.get(side[0]) and r not in side]
    hosts = sorted({f"node {r['node_rank']} ({r['host']})" for r in ranks
                    if int(r["rank"]) in side and "node_rank" in r})
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
                subject=listed)


def _side_words(side: Sequence[int], deviation: Mapping[int, float | None],
                tolerance: float) -> str:
    """"within 2e-02" / "beyond 2e-02 (worst 0.4)" / "not compared" for one side."""
    values = [d for r in side if (d := deviation.get(r)) is not None]
    if not values:
        return "not compared"
    worst = max(values, key=lambda d: d if d == d else float("inf"))
    return f"beyond {tolerance:g} (worst {worst:.3g})" if beyond(worst, tolerance) else \
        f"within {tolerance:g} (worst {worst:.3g})"


def _copies_section(result: Mapping[str, Any], verdicts: Verdicts) -> Section:
    copies, ranks = result["copies"], result["ranks"]
    if "skipped" in copies:
        return Section("copies", "Host<->device copies (pinned memory)", {},
                       [skip("stress.copies", copies["skipped"])])
    rows = list(copies["rows"])
    alone = [{"rank": r["rank"], "h2d_gbps": r["h2d_alone_gbps"],
              "d2h_gbps": r["d2h_alone_gbps"], "link": r["link"],
              "link_gbps": r["link_gbps"]} for r in rows if r["h2d_alone_gbps"] is not None]
    again = copies.get("again")
    findings = link_findings("stress.copies.link", alone, ranks, verdicts.copy_fraction,
                             copies_again(again, "alone"))
    together = {int(r["rank"]): min(r["h2d_together_gbps"], r["d2h_together_gbps"])
                for r in rows}
    findings += peer_findings("stress.copies.together", "host copies with every GPU at once "
                              "(slower direction)", "GB/s", together, ranks,
                              verdicts.peer_fraction, again=copies_again(again, "together"))
    table = [r | {"together_vs_alone": _together_ratio(r)} for r in rows]
    data = {"counted": "bytes one way / median copy time (one PCIe direction)",
            "results": table}
    if again:
        data["measured again"] = list(again)
    return Section("copies", "Host<->device copies (pinned memory): each GPU alone, then "
                   "all at once (GB/s)", data, findings)


def _together_ratio(row: Mapping[str, Any]) -> float | None:
    if not row.get("h2d_alone_gbps") or not row.get("d2h_alone_gbps"):
        return None
    ratio: float = min(row["h2d_together_gbps"] / row["h2d_alone_gbps"],
                       row["d2h_together_gbps"] / row["d2h_alone_gbps"])
    return round(ratio, 3)


def _p2p_section(result: Mapping[str, Any], verdicts: Verdicts) -> Section:
    p2p = result["p2p"]
    title = "Peer-to-peer copies between GPUs (GB/s, src row -> dst column)"
    if "skipped" in p2p:
        return Section("p2p", title, {}, [skip("stress.p2p", p2p["skipped"])])
    data: dict[str, Any] = {}
    findings: list[Finding] = []
    for node in p2p["nodes"]:
        where = f"node {node['node_rank']} ({node['host']})"
        if "skipped" in node:
            findings.append(skip("stress.p2p", f"{where}: {node['skipped']}", subject=where))
            continue
        data[f"{where} matrix"] = _p2p_matrix(node)
        data[f"{where} path classes"] = _path_classes(node)
        findings += p2p_findings(node, where, verdicts.copy_fraction)
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
        row: dict[str, Any] = {"src": _gpu_name(node, src)}
        for dst in range(count):
            pair = cell.get((src, dst))
            row[f"to cuda:{dst}"] = None if pair is None else (
                round(pair["gbps"], 1) if pair["gbps"] is not None else "no P2P")
        rows.append(row)
    return rows


def _gpu_name(node: Mapping[str, Any], index: int) -> str:
    gpu = node["gpus"][index]
    head = f"GPU {gpu['nvml_index']}" if gpu.get("nvml_index") is not None else "?"
    return f"cuda:{index} ({head})"
