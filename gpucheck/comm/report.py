"""The comm results (from `comm_worker`, complete or partial) as report sections, their
figures as metrics from the records read back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.comm.internode_verdicts import internode_findings, node_pair_rows, rail_findings
from gpucheck.comm.nccl_log import transport_view
from gpucheck.comm.records import CommRecords, PairRow, crossing, read_comm
from gpucheck.comm.verdicts import (
    ONE_RANK_BUSBW,
    baseline_findings,
    correctness_findings,
    node_figures,
    pair_findings,
    pair_matrix,
    pair_medians,
    slow_node_verdicts,
)
from gpucheck.distributed.nodes import NodeId, group_by_node, node_metric, nodes_rows, numa_findings
from gpucheck.faults import gpu_names, run_faults_section
from gpucheck.measure import Better, Metric, attach, rank_subjects, relative_spread, whole
from gpucheck.records import Unread
from gpucheck.report import Finding, Section, skip, unread_findings
from gpucheck.stats import human_bytes, number

TITLES = {"all_reduce": "all_reduce (busbw = algbw x 2(n-1)/n)",
          "all_gather": "all_gather (algbw counts the gathered output; busbw = algbw x (n-1)/n)",
          "reduce_scatter": "reduce_scatter (algbw counts the reduced input, n x the buffer; "
                            "busbw = algbw x (n-1)/n)",
          "all_to_all": "all_to_all (busbw = algbw x (n-1)/n)",
          "broadcast": "broadcast from rank 0 (busbw = algbw)"}


PAIRWISE_TITLE = "Pairwise send/recv bandwidth on each node (GB/s)"


@dataclass(frozen=True)
class Verdicts:  # the thresholds the user chose

    pair_threshold: float
    baseline_busbw_gbps: float | None
    slow_node_fraction: float


def _setup_section(result: Mapping[str, Any], unread: Sequence[Unread] = ()) -> Section:
    sizes = result.get("sizes_bytes") or [0]
    data = {"world_size": result["world_size"], "nodes": len(group_by_node(result["ranks"])),
            "device": result["device"], "backend": result["backend"],
            "sizes": f"{human_bytes(sizes[0])} .. {human_bytes(sizes[-1])} per rank buffer",
            "iters": result["iters"], "warmup": result["warmup"],
            "complete": result.get("complete", False), "ranks": result["ranks"]}
    if result["world_size"] == 1:
        data["bus_bandwidth"] = ONE_RANK_BUSBW
    if result.get("nccl_set_by_gpucheck"):  # distributed.deadline.BACKSTOP, where unset
        data["nccl_set_by_gpucheck"] = result["nccl_set_by_gpucheck"]
    return Section("comm", "Collective bandwidth: setup and ranks", data,
                   numa_findings(result["ranks"]) + unread_findings("comm.rank_record", unread))


def _collective_section(name: str, rows: list[dict[str, Any]], verdicts: Verdicts,
                        planned: int) -> Section:
    table = [{k: v for k, v in r.items() if k != "rank_times_us"} for r in rows]
    findings: list[Finding] = correctness_findings(name, rows)
    if name == "all_reduce":
        findings += baseline_findings(rows, verdicts.baseline_busbw_gbps, name)
    data: dict[str, Any] = {"sizes_done": f"{len(rows)} of {planned}", "results": table}
    return Section(name, TITLES.get(name, name), data, findings)


def _names(result: Mapping[str, Any]) -> dict[int, str]:
    return {int(r["rank"]): f"rank {r['rank']} (node {r['node_rank']} {r['host']}, "
            f"{r['device']})" for r in result["ranks"]}


def _repeats(pairs: Sequence[PairRow]) -> list[dict[str, Any]]:
    return [{"src": p.src, "dst": p.dst, "samples_gbps": None if p.samples_gbps is None
             else list(p.samples_gbps)} for p in pairs]


def _pairwise_section(result: Mapping[str, Any], records: CommRecords,
                      verdicts: Verdicts) -> Section:
    pairwise, pairs, again = result["pairwise"], records.pairs, records.pairs_again
    ranks = [int(r["rank"]) for r in result["ranks"]]
    data = {"size_bytes": pairwise["size_bytes"], "iters": pairwise["iters"],
            "repeats": pairwise.get("repeats", 1),
            "bandwidth_gbps (src row -> dst column)": pair_matrix(pairs, ranks),
            "repeats_gbps": _repeats(pairs)}
    if again:
        data["measured again"] = _repeats(again)
    return Section("pairwise", PAIRWISE_TITLE, data, pair_findings(
        pairs, verdicts.pair_threshold, _names(result), again, str(result.get("device"))))


def _nodes_section(result: Mapping[str, Any], records: CommRecords,
                   verdicts: Verdicts) -> Section | None:
    """Per node: its ranks, median pair bandwidth and slowest all_reduce time, judged."""
    ranks, pairs = result["ranks"], records.pairs
    if len(group_by_node(ranks)) < 2:
        return None
    rows = result["collectives"].get("all_reduce") or []
    times = dict(enumerate(rows[-1]["rank_times_us"])) if rows else {}
    time_metric = node_metric(ranks, times, combine=max)
    table = nodes_rows(ranks, pair_medians(ranks, pairs), "pair_median_gbps")
    for row in table:
        row["largest_all_reduce_us"] = time_metric.get(NodeId(row["node_rank"], row["host"]))
    again = result.get("nodes_again")
    findings = slow_node_verdicts(node_figures(ranks, pairs, rows),
                                  verdicts.slow_node_fraction, again, records.node_pairs, ranks,
                                  str(result.get("device")))
    data: dict[str, Any] = {"nodes": table}
    if again:
        data["measured again"] = again | ({"pairs": [crossing(p) for p in records.node_pairs]}
                                          if "pairs" in again else {})
    return Section("nodes", "Nodes", data, findings)


def _skipped(name: str, title: str, check: str, reason: str) -> Section:
    return Section(name, title, {"skipped": reason}, [skip(check, reason)])


def _internode_section(result: Mapping[str, Any], records: CommRecords,
                       verdicts: Verdicts) -> Section:
    """Node pairs (sum of rails) and every rail; skipped with the reason on one node."""
    nodes = list(group_by_node(result["ranks"]))
    labels = {i: node.label for i, node in enumerate(nodes)}
    internode = result.get("internode")
    title = "Between nodes: send/recv per node pair and rail (GB/s)"
    if len(nodes) < 2:
        return _skipped("internode", title, "comm.internode.slow_pair",
                        "one node: nothing between nodes")
    if not internode:
        reason = str(result.get("p2p_skipped") or
                     "not measured (the run ended before the node-to-node rounds)")
        return _skipped("internode", title, "comm.internode.slow_pair", reason)
    links, again = records.links, records.links_again
    rows = node_pair_rows(links)

    def named(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r | {"src": labels[r["src_node"]], "dst": labels[r["dst_node"]]} for r in rows]

    data = {"size_bytes": internode["size_bytes"], "iters": internode["iters"],
            "rounds": len(nodes) - 1, "node_pairs": named(rows),
            "rails": [crossing(x) for x in links]}
    if again:
        data["measured again"] = named(node_pair_rows(again))
    device = str(result.get("device"))
    findings = (internode_findings(rows, verdicts.pair_threshold, labels, again, device)
                + rail_findings(links, verdicts.pair_threshold, labels, again, device))
    return Section("internode", title, data, findings)


def _transport_section(result: Mapping[str, Any], records: CommRecords) -> Section:
    """The transport NCCL used on each rank; n/a on gloo."""
    title = "NCCL transport per rank"
    backend = str(result.get("backend"))
    entries = records.transport
    if backend == "nccl" and entries is None:
        reason = "not read (the run ended before the transport was gathered)"
        return Section("transport", title, {"transport": reason},
                       [skip("comm.transport.sockets_with_ib", reason)])
    data, findings = transport_view(entries or (), _names(result), backend,
                                    len(group_by_node(result["ranks"])))
    return Section("transport", title, data, findings)


def comm_sections(result: Mapping[str, Any], verdicts: Verdicts) -> list[Section]:
    """Setup, each collective, pairwise, nodes, between nodes, NCCL transport, faults."""
    # Every rank's record read back first (gpucheck.comm.records): the sections below
    # read only the ones that did; the others are named in the setup section.
    records = read_comm(result)
    ranks = [int(r["rank"]) for r in records.entries]
    # Hardware faults during the run: every rank's watch, or (a failed run) rank 0's.
    faults = run_faults_section(result.get("faults") or [], ranks, gpu_names(records.entries))
    if "collectives" not in result:  # failed before the first size: rank 0's watch only
        return [faults]
    result = {**result, "ranks": list(records.entries)}
    sections = [_setup_section(result, records.unread)]
    planned = len(result.get("sizes_bytes") or [])
    for name, rows in result["collectives"].items():
        sections.append(_collective_section(name, rows, verdicts, planned))
    if records.pairs:
        sections.append(_pairwise_section(result, records, verdicts))
    elif result.get("p2p_skipped") and int(result["world_size"]) > 1:
        sections.append(_skipped("pairwise", PAIRWISE_TITLE, "comm.pairwise.slow_pair",
                                 str(result["p2p_skipped"])))
    nodes = _nodes_section(result, records, verdicts)
    if nodes is not None:
        sections.append(nodes)
    sections.append(_internode_section(result, records, verdicts))
    sections.append(_transport_section(result, records))
    sections.append(faults)
    attach(sections, comm_metrics(result, records), {})
    return sections


def comm_metrics(result: Mapping[str, Any], records: CommRecords) -> list[Metric]:
    """`comm.<collective>.busbw_gbps@<bytes>` (spread: how far apart the ranks ended the
    same operations) and `comm.pairwise.gbps` per ordered pair (spread: its repeats')."""
    found = []
    for name, rows in result["collectives"].items():
        for row in rows if isinstance(rows, list) else ():
            size, value = whole(row.get("size_bytes")), number(row.get("busbw_gbps"))
            if size is not None and value is not None:
                spread = relative_spread(row.get("time_us"), row.get("fastest_time_us"))
                found.append(Metric(f"comm.{name}.busbw_gbps@{size}", "GB/s", Better.HIGHER,
                                    value, spread=spread))
    ranks = rank_subjects(records.entries)

    def words(rank: int) -> str:
        known = ranks.get(rank)
        return known.label if known is not None and known.gpu is not None else ""

    for pair in records.pairs:
        src, dst, samples = pair.src, pair.dst, pair.samples_gbps
        label = (f"{words(src) or f'rank {src}'} -> {words(dst) or f'rank {dst}'}"
                 if words(src) or words(dst) else None)
        found.append(Metric("comm.pairwise.gbps", "GB/s", Better.HIGHER, pair.bandwidth_gbps,
                            subject.pair(src, dst, label),
                            relative_spread(max(samples), min(samples)) if samples else None))
    return found
