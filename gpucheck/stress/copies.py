"""Host<->device copies through pinned memory and the peer-copy matrix between GPUs: the
two phases that measure them on every rank and their report sections (docs/stress.md
says why local rank 0 measures the matrix alone)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subject_
from gpucheck.confirm import remeasure
from gpucheck.devices import cuda_device_count
from gpucheck.distributed import progress
from gpucheck.distributed.session import roster
from gpucheck.distributed.world import host_name
from gpucheck.probes.gpus import paths_or_none
from gpucheck.records import as_dict
from gpucheck.report import Finding, Section, skip
from gpucheck.stress.rank import RankContext, barrier, gather, host_wait, publish, read_link
from gpucheck.stress.records import CopyRow, StressRecords
from gpucheck.stress.verdicts import (
    class_suspects,
    copies_again,
    crossed,
    link_findings,
    p2p_findings,
    peer_findings,
)
from gpucheck.timing import timed_batch

HOST_COPY_BYTES = 256 << 20
PEER_COPY_BYTES = 256 << 20
COPY_ITERS = 10


@dataclass(frozen=True)
class HostCopies:
    """One rank's pinned-memory copy rates in one setting ("alone" or "together")."""

    rank: int
    setting: str
    size_bytes: int
    h2d_gbps: float
    d2h_gbps: float


def _gbps(size: int, times_s: list[float]) -> float:
    return size / statistics.median(times_s) / 1e9


def host_copies(rank: int, setting: str, host: Any, dev: Any) -> HostCopies:
    """Time COPY_ITERS copies each way between a pinned host buffer and the GPU."""
    import torch

    dev.copy_(host, non_blocking=True)  # warm-up: first use of the copy engines
    host.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    h2d = timed_batch(lambda i: dev.copy_(host, non_blocking=True), COPY_ITERS, "cuda")
    d2h = timed_batch(lambda i: host.copy_(dev, non_blocking=True), COPY_ITERS, "cuda")
    size = host.numel() * host.element_size()
    return HostCopies(rank, setting, size, _gbps(size, h2d), _gbps(size, d2h))


def peer_matrix(local_world_size: int, fraction: float = 0.6) -> dict[str, Any]:
    """{"gpus", "pairs" (src, dst, peer_access, gbps), "again" (the slow pairs and a
    known-good one measured again, when a pair was slow)} or {"skipped": why}."""
    import torch

    from gpucheck.probes.nvml import cuda_identity

    visible = cuda_device_count(torch)
    if visible < 2 and local_world_size < 2:
        return {"skipped": "one GPU in this run on this node: no peer to copy to"}
    if visible < 2:
        return {"skipped": "this process sees one GPU (CUDA_VISIBLE_DEVICES or srun "
                "--gpus-per-task): peer copies need one process that sees every GPU"}
    if visible < local_world_size:
        return {"skipped": f"local rank 0 sees {visible} of the node's {local_world_size} "
                "GPUs: peer copies need one process that sees every GPU"}
    gpus = [cuda_identity(torch, i).row() for i in range(visible)]
    paths, why = paths_or_none([g.get("pci_bus_id") for g in gpus])
    every = [(s, d) for s in range(visible) for d in range(visible) if s != d]
    try:
        pairs = [p | (paths[(p["src"], p["dst"])].row() if (p["src"], p["dst"]) in paths
                      else {}) for p in _measure_pairs(visible, every)]
        again = second_look(pairs, fraction, lambda wanted: _measure_pairs(visible, wanted))
    except RuntimeError as exc:  # e.g. exclusive-process compute mode: no second context
        return {"gpus": gpus, "skipped": f"could not open every GPU from one process: "
                f"{str(exc).strip().splitlines()[0][:200]}"}
    return {"gpus": gpus, "pairs": pairs} | ({"again": again} if again else {}) | \
        ({"paths_unread": why} if why else {})


def second_look(pairs: list[dict[str, Any]], fraction: float,
                measure: Callable[[list[tuple[int, int]]], list[dict[str, Any]]],
                ) -> list[dict[str, Any]]:
    """The known-good reference pair(s), then every slow pair, measured again by this
    process while the node's other ranks are still parked; [] when nothing is slow."""
    plans = [s for s in class_suspects(pairs, fraction).values() if not s.empty]
    if not plans:
        return []
    wanted = [pair for s in plans for pair in (*s.references, *s.pairs)]
    return measure(list(dict.fromkeys(wanted)))


def _measure_pairs(visible: int, wanted: list[tuple[int, int]]) -> list[dict[str, Any]]:
    import torch

    buffers = [torch.ones(PEER_COPY_BYTES, dtype=torch.uint8, device=f"cuda:{i}")
               for i in range(visible)]
    landing = [torch.empty_like(b) for b in buffers]
    pairs = []
    for src, dst in wanted:
        access = bool(torch.cuda.can_device_access_peer(src, dst))
        gbps = _pair_gbps(buffers[src], landing[dst]) if access else None
        pairs.append({"src": src, "dst": dst, "peer_access": access, "gbps": gbps})
    del buffers, landing
    torch.cuda.empty_cache()
    return pairs


def _pair_gbps(src: Any, dst: Any) -> float:
    """torch copies across GPUs on the source's current stream, so events there time it."""
    import torch

    with torch.cuda.device(src.device):
        dst.copy_(src)
        torch.cuda.synchronize(src.device)
        torch.cuda.synchronize(dst.device)
        times = timed_batch(lambda i: dst.copy_(src, non_blocking=True), COPY_ITERS, "cuda")
        torch.cuda.synchronize(dst.device)
    return _gbps(src.numel(), times)


CPU_SKIP = "CPU ranks: there is no host<->device or peer link to measure"


def copies_phase(ctx: RankContext, result: dict[str, Any]) -> None:
    """Pinned host copies: each GPU alone (local ranks take turns), then all at once."""
    if ctx.spec.device != "cuda":
        result["copies"] = {"skipped": CPU_SKIP}
        return
    rows = gather(ctx, copy_row(ctx, result))
    result["copies"] = {"rows": rows}
    spec = ctx.spec

    def again(_: Any) -> list[Any]:  # confirm before condemning: every rank copies again
        publish(ctx, result)
        progress.set_step(ctx.run, "copies: measured again")
        return gather(ctx, copy_row(ctx, result))

    _, second = remeasure(ctx.world.rank, lambda: crossed(copy_findings(
        [CopyRow(**r) for r in rows], result["ranks"], spec.copy_fraction,
        spec.peer_fraction)), again, ctx.run)
    if second is not None:
        result["copies"]["again"] = second


def copy_row(ctx: RankContext, result: dict[str, Any]) -> dict[str, Any]:
    """This rank's copies alone (local ranks take turns), then all at once."""
    import torch

    world = ctx.world
    # After the rank is placed: pinned pages land on the node of the thread touching them.
    host = torch.ones(HOST_COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(HOST_COPY_BYTES, dtype=torch.uint8, device=ctx.device)
    alone = None
    # As many turns as the largest node has ranks: every rank passes every barrier.
    turns = 1 + max(int(r["local_rank"]) for r in result["ranks"])
    for turn in range(turns):
        barrier(ctx)
        if world.local_rank == turn:
            alone = host_copies(world.rank, "alone", host, dev)
    barrier(ctx)
    together = host_copies(world.rank, "together", host, dev)
    # Read under load: an idle GPU's link may have dropped its speed to save power.
    link = read_link(ctx.bus_id) if ctx.bus_id else None
    del host, dev
    torch.cuda.empty_cache()
    return as_dict(CopyRow(
        rank=world.rank, size_bytes=together.size_bytes,
        h2d_alone_gbps=alone.h2d_gbps if alone else None,
        d2h_alone_gbps=alone.d2h_gbps if alone else None,
        h2d_together_gbps=together.h2d_gbps, d2h_together_gbps=together.d2h_gbps,
        link=link.label() if link else None, link_gbps=link.rate_gbps if link else None))


def p2p_phase(ctx: RankContext, result: dict[str, Any]) -> None:
    if ctx.spec.device != "cuda":
        result["p2p"] = {"skipped": CPU_SKIP}
        return
    node_ranks = [r.rank for r in roster(ctx.run) if r.node_rank == ctx.world.node_rank]
    result["p2p"] = peer_phase(ctx, lambda n: peer_matrix(n, ctx.spec.copy_fraction),
                               node_ranks)


def peer_phase(ctx: RankContext, measure: Callable[[int], dict[str, Any]],
               node_ranks: list[int]) -> dict[str, Any]:
    """Each node's local rank 0 measures the peer matrix while the node's other ranks
    (`node_ranks`) are parked on the host, not in the gather's NCCL kernel."""
    world, spec = ctx.world, ctx.spec
    parking = host_wait(spec.backend, world.world_size, node_ranks, spec.timeout_s)
    barrier(ctx)
    mine = None
    if world.local_rank == 0:
        mine = {"node_rank": world.node_rank, "host": host_name(),
                **measure(world.local_world_size)}
    if parking is not None:
        parking.wait()
    return {"nodes": [m for m in gather(ctx, mine) if m is not None]}


# -- the report's sections ----------------------------------------------------------

def copies_section(copies: Mapping[str, Any], records: StressRecords, peer_fraction: float,
                   copy_fraction: float) -> Section:
    """The copies' table and `copy_findings`, or the phase's SKIP."""
    ranks = records.entries
    if "skipped" in copies:
        return Section("copies", "Host<->device copies (pinned memory)", {},
                       [skip("stress.copies", str(copies["skipped"]))])
    rows = records.copies
    again = [as_dict(r) for r in records.copies_again or ()]
    findings = copy_findings(rows, ranks, copy_fraction, peer_fraction, again)
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


def copy_findings(rows: Sequence[CopyRow], ranks: Sequence[Mapping[str, Any]],
                  copy_fraction: float, peer_fraction: float,
                  again: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """Host copies alone against each link, all at once against the node's peers; the
    phase measures again the ranks these question (`verdicts.crossed`)."""
    alone = [{"rank": r.rank, "h2d_gbps": r.h2d_alone_gbps, "d2h_gbps": r.d2h_alone_gbps,
              "link": r.link, "link_gbps": r.link_gbps}
             for r in rows if r.h2d_alone_gbps is not None]
    findings = link_findings("stress.copies.link", alone, ranks, copy_fraction,
                             copies_again(again, "alone"))
    together = {r.rank: min(r.h2d_together_gbps, r.d2h_together_gbps) for r in rows}
    return findings + peer_findings(
        "stress.copies.together", "host copies with every GPU at once (slower direction)",
        "GB/s", together, ranks, peer_fraction, again=copies_again(again, "together"))


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
