"""Node-to-node bandwidth in parallel rounds, rail by rail.

Round r (1 .. N-1) pairs node i with node (i + r) mod N: every node sends to node
i + r and receives from node i - r at the same time, so N nodes need N - 1 rounds
(not N^2 steps) and every ordered node pair is measured exactly once. Traffic is
bidirectional because that is what all_reduce does to a node's links.

All rails of a node pair run at once (local rank k of node i sends to local rank k
of node i + r, for every k): that is what a real job puts on the node's NICs, and a
node-pair figure is the sum of its rails. Each rail's own figure is kept too, so a
single slow rail (NIC) still shows, although rails that share a NIC or a PCIe switch
are measured under their real contention, not in isolation.

The receiver times each link (a barrier, then from posting its receives to the last
one done), so a slow sender shows on its own outgoing links only. On NCCL the sends
and receives of a rank are one group (separate groups on one stream would deadlock
in a ring); on gloo the sends go one at a time (see `collectives`), the receives are
posted before them.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.comm.collectives import ELEMENT_BYTES, synchronize
from gpucheck.report import Finding, ok, warn

# Test-only: "NODE_RANK:SECONDS" makes the ranks of that node sleep before each send.
TEST_SLOW_SENDS_VAR = "GPUCHECK_TEST_SLOW_SENDS"
GB = 1e9


def round_schedule(nodes: int) -> list[list[tuple[int, int]]]:
    """Round r (1 .. nodes-1): every node i sends to (i + r) mod nodes."""
    return [[(i, (i + r) % nodes) for i in range(nodes)] for r in range(1, nodes)]


def rail_links(node_ranks: Sequence[Sequence[int]], src_node: int,
               dst_node: int) -> list[tuple[int, int, int]]:
    """(rail, src rank, dst rank): local rank k with local rank k, as far as both go."""
    src, dst = node_ranks[src_node], node_ranks[dst_node]
    return [(k, src[k], dst[k]) for k in range(min(len(src), len(dst)))]


def _slow_sends(node_index: int) -> float:
    """Seconds to sleep before each send (the test hook), 0 when unset or another node."""
    raw = os.environ.get(TEST_SLOW_SENDS_VAR, "")
    node, _, seconds = raw.partition(":")
    return float(seconds) if raw and int(node) == node_index else 0.0


def _exchange(me_send: int | None, me_recv: int | None, size_bytes: int, iters: int,
              device: str, delay_s: float) -> float | None:
    """Send `iters` buffers to `me_send` while receiving as many from `me_recv`;
    the seconds until the last receive (None when this rank receives nothing)."""
    import torch
    import torch.distributed as dist

    where = "cuda" if device == "cuda" else "cpu"
    count = max(size_bytes // ELEMENT_BYTES, 1)
    out, into = torch.zeros(count, device=where), torch.zeros(count, device=where)
    nccl = str(dist.get_backend()) == "nccl"
    synchronize(device)
    began = time.perf_counter()
    recvs = [dist.P2POp(dist.irecv, into, me_recv)] * iters if me_recv is not None else []
    sends = [dist.P2POp(dist.isend, out, me_send)] * iters if me_send is not None else []
    if nccl:
        works = dist.batch_isend_irecv(recvs + sends) if recvs + sends else []
        for work in works:
            work.wait()
        synchronize(device)
        return time.perf_counter() - began if recvs else None
    posted = [dist.irecv(into, me_recv) for _ in recvs]
    # A helper thread waits on the receives, so this rank's own (possibly slow) sends
    # do not delay the moment its receives are seen done.
    ended: list[float] = []
    waiter = threading.Thread(target=_wait_all, args=(posted, ended), daemon=True)
    waiter.start()
    for _ in sends:
        if delay_s:
            time.sleep(delay_s)
        dist.isend(out, me_send).wait()
    waiter.join()
    if len(ended) != 1:
        raise RuntimeError("a receive between nodes failed (see the rank's error)")
    return ended[0] - began if recvs else None


def _wait_all(works: Sequence[Any], ended: list[float]) -> None:
    """Wait on every work; append the time (nothing when a wait raised)."""
    for work in works:
        work.wait()
    ended.append(time.perf_counter())


def measure_internode(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                      device: str) -> list[dict[str, Any]]:
    """Run every round; return the links this rank received on."""
    import torch.distributed as dist

    from gpucheck.distributed import progress
    from gpucheck.distributed.nodes import group_by_node
    from gpucheck.distributed.session import barrier

    me = dist.get_rank()
    node_ranks = list(group_by_node(roster).values())
    mine_node = next(i for i, ranks in enumerate(node_ranks) if me in ranks)
    delay = _slow_sends(mine_node)
    links: list[dict[str, Any]] = []
    for r, pairs in enumerate(round_schedule(len(node_ranks)), start=1):
        progress.set_step(f"between nodes: round {r}")
        to = {s: d for _, s, d in rail_links(node_ranks, *pairs[mine_node])}
        src_node = (mine_node - r) % len(node_ranks)
        came = {d: (k, s) for k, s, d in rail_links(node_ranks, src_node, mine_node)}
        peers = (to.get(me), came.get(me, (0, None))[1])
        # Warm-up, untimed: NCCL's first send/recv between two ranks creates their
        # communicator, which must not be inside the timed exchange.
        _exchange(*peers, size_bytes, 1, device, 0.0)
        barrier()
        seconds = _exchange(*peers, size_bytes, iters, device, delay)
        if seconds is not None:
            rail, src = came[me]
            links.append({"round": r, "src_node": src_node, "dst_node": mine_node,
                          "rail": rail, "src": src, "dst": me,
                          "bandwidth_gbps": round(size_bytes * iters / seconds / GB, 4)})
    barrier()
    return links


def node_pair_rows(links: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per ordered node pair: the sum of its rails (they ran at once) and its slowest rail."""
    by_pair: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for link in links:
        by_pair.setdefault((link["src_node"], link["dst_node"]), []).append(link)
    rows = []
    for (src, dst), rails in sorted(by_pair.items()):
        slowest = min(rails, key=lambda link: link["bandwidth_gbps"])
        rows.append({"src_node": src, "dst_node": dst, "round": rails[0]["round"],
                     "rails": len(rails),
                     "bandwidth_gbps": round(sum(x["bandwidth_gbps"] for x in rails), 4),
                     "slowest_rail": slowest["rail"],
                     "slowest_rail_gbps": slowest["bandwidth_gbps"]})
    return rows


def shared_node(slow_pairs: Sequence[tuple[int, int]]) -> int | None:
    """The node in more than half of the slow pairs, and in more than any other node;
    None with fewer than two slow pairs (one pair cannot tell its two ends apart)."""
    if len(slow_pairs) < 2:
        return None
    counts: dict[int, int] = {}
    for pair in slow_pairs:
        for node in set(pair):
            counts[node] = counts.get(node, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    node, count = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    return node if count * 2 > len(slow_pairs) and count > runner_up else None


def internode_findings(rows: Sequence[Mapping[str, Any]], threshold: float,
                       labels: Mapping[int, str]) -> list[Finding]:
    """WARN each node pair below `threshold` x the median node pair; name the shared node."""
    if not rows:
        return []
    median = statistics.median(r["bandwidth_gbps"] for r in rows)
    slow = [r for r in rows if r["bandwidth_gbps"] < threshold * median]
    check = "comm.internode.slow_pair"
    findings = [warn(check, f"{labels[r['src_node']]} -> {labels[r['dst_node']]}: "
                     f"{r['bandwidth_gbps']:.3g} GB/s over {r['rails']} rail(s), below "
                     f"{threshold:g} x the median node pair's {median:.3g} GB/s",
                     hint="check the NICs, cables and switch ports between these two nodes "
                     "(ibstat, ibdiagnet, ethtool) and the transport NCCL chose",
                     subject=f"node {r['src_node']} -> node {r['dst_node']}") for r in slow]
    if not slow:
        return [ok(check, f"{len(rows)} node pairs within {threshold:g} x the median "
                   f"({median:.3g} GB/s)")]
    suspect = shared_node([(r["src_node"], r["dst_node"]) for r in slow])
    if suspect is not None:
        findings.append(warn(
            "comm.internode.shared_node",
            f"{labels[suspect]} is in most of the {len(slow)} slow node pairs",
            hint="suspect this node's NICs, their PCIe links or its switch port; rerun "
            "without it to confirm", subject=labels[suspect]))
    return findings


def rail_findings(links: Sequence[Mapping[str, Any]], threshold: float,
                  labels: Mapping[int, str]) -> list[Finding]:
    """WARN each rail link below `threshold` x the median rail link, and the node a
    rail's slow links share (its NIC on that rail). Only with 2+ rails per node: with
    one rail, a rail is its node pair and `internode_findings` says it all."""
    if max((link["rail"] for link in links), default=0) < 1:
        return []
    median = statistics.median(link["bandwidth_gbps"] for link in links)
    slow = [link for link in links if link["bandwidth_gbps"] < threshold * median]
    check = "comm.internode.slow_rail"
    if not slow:
        return [ok(check, f"{len(links)} rail links within {threshold:g} x the median "
                   f"({median:.3g} GB/s)")]
    findings = [warn(check, f"rail {x['rail']}: rank {x['src']} ({labels[x['src_node']]}) "
                     f"-> rank {x['dst']} ({labels[x['dst_node']]}): "
                     f"{x['bandwidth_gbps']:.3g} GB/s, below {threshold:g} x the median "
                     f"rail link's {median:.3g} GB/s",
                     hint="one NIC or its cable: check this rail's NIC on both nodes "
                     "(ibstat, its PCIe link width, NCCL_IB_HCA's order)",
                     subject=f"rank {x['src']} -> rank {x['dst']}") for x in slow]
    for rail in sorted({x["rail"] for x in slow}):
        pairs = [(x["src_node"], x["dst_node"]) for x in slow if x["rail"] == rail]
        suspect = shared_node(pairs)
        if suspect is not None:
            findings.append(warn(
                "comm.internode.shared_node",
                f"{labels[suspect]} is in most of the {len(pairs)} slow links of rail {rail}",
                hint="suspect this node's NIC on that rail (ibstat, its PCIe link, its "
                "cable and switch port)", subject=f"{labels[suspect]} rail {rail}"))
    return findings
