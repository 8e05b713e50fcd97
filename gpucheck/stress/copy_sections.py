"""Host<->device and peer copies as report sections (`gpucheck stress`, phases copies and
p2p): the tables, and the verdicts of gpucheck.stress.verdicts and .p2p_verdicts."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck import subject as subjects
from gpucheck.records import as_dict
from gpucheck.report import Finding, Section, skip
from gpucheck.stress.p2p_verdicts import p2p_findings
from gpucheck.stress.records import CopyRow, StressRecords
from gpucheck.stress.verdicts import Again, link_findings, peer_findings


def copies_section(copies: Mapping[str, Any], records: StressRecords, peer_fraction: float,
                   copy_fraction: float) -> Section:
    """`copies`: the phase's result ({"skipped": why} on CPU ranks); `records`: every
    rank's copy rows as read back."""
    ranks = records.entries
    if "skipped" in copies:
        return Section("copies", "Host<->device copies (pinned memory)", {},
                       [skip("stress.copies", str(copies["skipped"]))])
    rows = records.copies
    alone = [{"rank": r.rank, "h2d_gbps": r.h2d_alone_gbps, "d2h_gbps": r.d2h_alone_gbps,
              "link": r.link, "link_gbps": r.link_gbps}
             for r in rows if r.h2d_alone_gbps is not None]
    again = records.copies_again
    findings = link_findings("stress.copies.link", alone, ranks, copy_fraction,
                             _slower(again, alone=True))
    together = {r.rank: min(r.h2d_together_gbps, r.d2h_together_gbps) for r in rows}
    findings += peer_findings("stress.copies.together", "host copies with every GPU at once "
                              "(slower direction)", "GB/s", together, ranks,
                              peer_fraction, again=_slower(again, alone=False))
    table = [as_dict(r) | {"together_vs_alone": _together_ratio(r)} for r in rows]
    data: dict[str, Any] = {"counted": "bytes one way / median copy time (one PCIe direction)",
                            "results": table}
    if again:
        data["measured again"] = [as_dict(r) for r in again]
    return Section("copies", "Host<->device copies (pinned memory): each GPU alone, then "
                   "all at once (GB/s)", data, findings)


def _slower(rows: Sequence[CopyRow] | None, alone: bool) -> Again | None:
    """The second copies' slower direction per rank, alone or all at once; None when
    they were not measured again."""
    if not rows:
        return None
    pairs = [(r.h2d_alone_gbps, r.d2h_alone_gbps) if alone else
             (r.h2d_together_gbps, r.d2h_together_gbps) for r in rows]
    return Again({r.rank: min(h2d, d2h) for r, (h2d, d2h) in zip(rows, pairs, strict=True)
                  if h2d is not None and d2h is not None})


def _together_ratio(row: CopyRow) -> float | None:
    if not row.h2d_alone_gbps or not row.d2h_alone_gbps:
        return None
    return round(min(row.h2d_together_gbps / row.h2d_alone_gbps,
                     row.d2h_together_gbps / row.d2h_alone_gbps), 3)


def p2p_section(p2p: Mapping[str, Any], records: StressRecords,
                copy_fraction: float) -> Section:
    """`p2p`: the phase's result ({"skipped": why} on CPU ranks); `records`: each node's
    matrix as read back."""
    title = "Peer-to-peer copies between GPUs (GB/s, src row -> dst column)"
    if "skipped" in p2p:
        return Section("p2p", title, {}, [skip("stress.p2p", str(p2p["skipped"]))])
    data: dict[str, Any] = {}
    findings: list[Finding] = []
    for node in records.p2p_nodes:
        where = subjects.node(int(node["node_rank"]), f"node {node['node_rank']} ({node['host']})",
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
