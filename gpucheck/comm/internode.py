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

Each link is timed apart from what its receiver sends, so slowness lands on the
links of the node that has it. gloo: the receiver times its receives alone (a
barrier, then from posting them to the last one done, waited on a helper thread
while its sends go one at a time), so a slow sender shows on its own outgoing links
only. NCCL: the sends and receives of a rank are one group (separate groups on one
stream would deadlock in a ring), whose end waits for both directions; every rank
times its group (CUDA events from a start aligned on the device: an untimed
one-element exchange with the same peers first, `_exchange_nccl`) and reports it both
for the link it received on and for the link it sent on. Both groups carried the
link, so each time bounds it: a link's figure is the faster of its two ends'
(`internode_verdicts.both_ends`). A node slow to receive slows its own group and its
senders' groups, but not the groups of those senders' own senders: the link into
the node before it reads its true rate from that link's sender.
Each link is timed `repeats` times in a row, every repeat after a barrier (without
it a rank held up by a slow peer would start its next sends late and make its own
receivers read slow); the repeats' spread is the measurement's noise.

Then the second look (`run_internode`): the slow node pairs, and a suspect node's
pairs, are measured again, one node pair at a time, beside a pair of known-good
nodes (gpucheck.peers.eliminate; the verdicts are in gpucheck.comm.internode_verdicts).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from gpucheck.comm.collectives import (
    ELEMENT_BYTES,
    Work,
    make_clock,
    started,
    time_batch,
)
from gpucheck.comm.internode_verdicts import (
    both_ends,
    find_node_suspects,
    node_pair_rows,
    node_samples,
    rail_exchanges,
)
from gpucheck.comm.records import LinkRow, SentRow
from gpucheck.context import RunContext
from gpucheck.distributed.deadline import synchronize
from gpucheck.peers import Suspects

GB = 1e9


def round_schedule(nodes: int, shifts: Sequence[int] | None = None,
                   ) -> list[list[tuple[int, int]]]:
    """Round r (1 .. nodes-1): every node i sends to (i + r) mod nodes. With `shifts`,
    only those rounds (each below `nodes`, once): a constant number of rounds whatever
    the node count (`gpucheck preflight` runs shifts 1 and 2), enough to find one slow
    node by elimination (gpucheck.peers.eliminate), not every pair."""
    wanted = range(1, nodes) if shifts is None else \
        sorted({s for s in shifts if 0 < s < nodes})
    return [[(i, (i + r) % nodes) for i in range(nodes)] for r in wanted]


def rail_links(node_ranks: Sequence[Sequence[int]], src_node: int,
               dst_node: int) -> list[tuple[int, int, int]]:
    """(rail, src rank, dst rank): local rank k with local rank k, as far as both go."""
    src, dst = node_ranks[src_node], node_ranks[dst_node]
    return [(k, src[k], dst[k]) for k in range(min(len(src), len(dst)))]


class _Group:
    """The handles of one `batch_isend_irecv` as one `collectives.Work`."""

    def __init__(self, works: Sequence[Any]) -> None:
        self.works = list(works)

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)

    def block_current_stream(self) -> None:
        for work in self.works:
            work.block_current_stream()


def _batch(peers: tuple[int | None, int | None], out: Any, into: Any,
           iters: int) -> Callable[[], Work]:
    """One NCCL group: `iters` receives from peers[1] and sends to peers[0]."""
    import torch.distributed as dist

    send, recv = peers
    ops = ([dist.P2POp(dist.irecv, into, recv)] * iters if recv is not None else []) + \
        ([dist.P2POp(dist.isend, out, send)] * iters if send is not None else [])
    return lambda: _Group(dist.batch_isend_irecv(ops))


def _exchange_nccl(peers: tuple[int | None, int | None], out: Any, into: Any, iters: int,
                   device: str, wait_s: float) -> float:
    """NCCL: one group of every send and receive, timed on the device from an aligned
    start: an untimed one-element exchange with the same peers first, the stream made
    to wait on it, then the start event (`collectives.time_batch`'s `align`). Without
    it the clock started when this rank left the barrier (a 1 ms host poll under
    blocking wait) and counted the wait for its sender; with it the start event fires
    once the sender has joined. The group ends when both its directions have: its time
    covers this rank's receives and its sends (`Exchange`)."""
    flag_out, flag_in = out[:1].clone(), into[:1].clone()
    return time_batch([_batch(peers, out, into, iters)], make_clock(device), True, wait_s,
                      _batch(peers, flag_out, flag_in, 1))


class Exchange(NamedTuple):
    """One timed exchange on one rank: seconds until its receives were done, and
    seconds that cover its sends (None: no receive, or no send, or not timed).

    gloo times the receives alone (on a helper thread) and leaves `sent_s` None: a
    gloo send is done when its bytes are handed over, not when they arrived. NCCL
    cannot end a receive apart from the sends of its group (separate groups on one
    stream deadlock in a ring), so both are the group's time: each covers the link,
    and a link's figure is the faster of its two ends' (`internode_verdicts.both_ends`).
    """

    received_s: float | None
    sent_s: float | None


def _exchange(me_send: int | None, me_recv: int | None, size_bytes: int, iters: int,
              device: str, delay_s: float, recv_delay_s: float = 0.0, *,
              wait_s: float) -> Exchange:
    """Send `iters` buffers to `me_send` while receiving as many from `me_recv`; on NCCL
    the host waits at most `wait_s` (gloo's own timeout bounds its waits)."""
    import torch
    import torch.distributed as dist

    where = "cuda" if device == "cuda" else "cpu"
    count = max(size_bytes // ELEMENT_BYTES, 1)
    out, into = torch.zeros(count, device=where), torch.zeros(count, device=where)
    synchronize(device)
    if str(dist.get_backend()) == "nccl":
        if me_send is None and me_recv is None:
            return Exchange(None, None)
        seconds = _exchange_nccl((me_send, me_recv), out, into, iters, device, wait_s)
        return Exchange(seconds if me_recv is not None else None,
                        seconds if me_send is not None else None)
    began = time.perf_counter()
    posted = [dist.irecv(into, me_recv) for _ in range(iters)] if me_recv is not None else []
    # A helper thread waits on the receives, so this rank's own (possibly slow) sends
    # do not delay the moment its receives are seen done.
    ended: list[float] = []
    waiter = threading.Thread(target=_wait_all, args=(posted, ended, recv_delay_s),
                              daemon=True)
    waiter.start()
    for _ in range(iters if me_send is not None else 0):
        if delay_s:
            time.sleep(delay_s)
        started(dist.isend(out, me_send)).wait()
    waiter.join()
    if len(ended) != 1:
        raise RuntimeError("a receive between nodes failed (see the rank's error)")
    return Exchange(ended[0] - began if me_recv is not None else None, None)


def _wait_all(works: Sequence[Any], ended: list[float], delay_s: float = 0.0) -> None:
    """Wait on every work (the test hook's `delay_s` before each: a slow receiver);
    append the time (nothing when a wait raised)."""
    for work in works:
        if delay_s:
            time.sleep(delay_s)
        work.wait()
    ended.append(time.perf_counter())


Samples = tuple[list[float] | None, list[float] | None]  # GB/s received, sent per repeat


def _samples(peers: tuple[int | None, int | None], size_bytes: int, iters: int,
             device: str, delays: tuple[float, float], repeats: int,
             wait_s: float) -> Samples:
    """`repeats` timed exchanges in a row: GB/s in each, as this rank received (None:
    no receive) and as its sends were timed (None: none, or gloo). Their spread is
    the measurement's own noise (gpucheck.peers.eliminate)."""
    from gpucheck.distributed.session import barrier

    timed = []
    for _ in range(repeats):
        # Every repeat starts together: without the barrier a rank that waited on a slow
        # peer would start its next sends late, and its own receivers would read slow.
        barrier(wait_s)
        timed.append(_exchange(*peers, size_bytes, iters, device, *delays, wait_s=wait_s))

    def gbps(seconds: list[float | None]) -> list[float] | None:
        if not seconds or any(s is None or s <= 0 for s in seconds):
            return None
        return [round(size_bytes * iters / s / GB, 4) for s in seconds if s is not None]
    return gbps([t.received_s for t in timed]), gbps([t.sent_s for t in timed])


def _link(round_: int | str, src_node: int, dst_node: int, came: tuple[int, int], me: int,
          samples: list[float]) -> dict[str, Any]:
    return LinkRow(round=round_, src_node=src_node, dst_node=dst_node, rail=came[0],
                   src=came[1], dst=me, bandwidth_gbps=statistics.median(samples),
                   samples_gbps=tuple(samples)).to_dict()


def _sent(round_: int | str, src_node: int, dst_node: int, me: int, to: int,
          samples: list[float]) -> dict[str, Any]:
    """What this rank's timing says of the link it sent on (NCCL: its group's time)."""
    return SentRow(round=round_, src_node=src_node, dst_node=dst_node, src=me, dst=to,
                   sent_gbps=tuple(samples)).to_dict()


Measured = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # links received on, sent on


def measure_internode(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                      device: str, repeats: int = 1,
                      shifts: Sequence[int] | None = None,
                      *, ctx: RunContext) -> Measured:
    """Run every round (or only `shifts`: `round_schedule`); return the links this rank
    received on, and what it timed of the links it sent on (NCCL only). `ctx.hooks`:
    tests' slow senders and receivers."""
    import torch.distributed as dist

    from gpucheck.distributed import progress
    from gpucheck.distributed.nodes import group_by_node
    from gpucheck.distributed.session import barrier

    me = dist.get_rank()
    node_ranks = list(group_by_node(roster).values())
    mine_node = next(i for i, ranks in enumerate(node_ranks) if me in ranks)
    delays = ctx.hooks.node_delays(mine_node, node_ranks[mine_node].index(me))
    links: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []
    for pairs in round_schedule(len(node_ranks), shifts):
        r = (pairs[0][1] - pairs[0][0]) % len(node_ranks)  # the round's shift
        progress.set_step(ctx, f"between nodes: round {r}")
        to = {s: d for _, s, d in rail_links(node_ranks, *pairs[mine_node])}
        src_node = (mine_node - r) % len(node_ranks)
        came = {d: (k, s) for k, s, d in rail_links(node_ranks, src_node, mine_node)}
        peers = (to.get(me), came.get(me, (0, None))[1])
        # Warm-up, untimed: NCCL's first send/recv between two ranks creates their
        # communicator, which must not be inside the timed exchange.
        _exchange(*peers, size_bytes, 1, device, 0.0, wait_s=ctx.session.wait_s)
        received, sending = _samples(peers, size_bytes, iters, device, delays, repeats,
                                     ctx.session.wait_s)
        if received is not None:
            links.append(_link(r, src_node, mine_node, came[me], me, received))
        if sending is not None and peers[0] is not None:
            sent.append(_sent(r, mine_node, pairs[mine_node][1], me, peers[0], sending))
    barrier(ctx.session.wait_s)
    return links, sent


def _pair_links(node_ranks: Sequence[Sequence[int]], me: int, x: int,
                y: int) -> tuple[int | None, int | None, tuple[int, int] | None]:
    """This rank's (send peer, receive peer, (rail, src)) in an exchange of nodes x and
    y both ways at once, all rails; Nones for a rank of neither node."""
    for here, there in ((x, y), (y, x)):
        if me in node_ranks[here]:
            to = {s: d for _, s, d in rail_links(node_ranks, here, there)}
            came = {d: (k, s) for k, s, d in rail_links(node_ranks, there, here)}
            return to.get(me), came.get(me, (0, None))[1], came.get(me)
    return None, None, None


def measure_again(roster: Sequence[Mapping[str, Any]], exchanges: Sequence[tuple[int, int]],
                  size_bytes: int, iters: int, device: str, repeats: int,
                  *, ctx: RunContext) -> Measured:
    """The second look: each exchange (node x <-> node y, all rails, both ways at once,
    as in the rounds) alone, a barrier of all ranks around each; the links this rank
    received on and sent on, as `measure_internode` returns them (round "again")."""
    import torch.distributed as dist

    from gpucheck.distributed import progress
    from gpucheck.distributed.nodes import group_by_node
    from gpucheck.distributed.session import barrier

    me = dist.get_rank()
    node_ranks = list(group_by_node(roster).values())
    mine_node = next(i for i, ranks in enumerate(node_ranks) if me in ranks)
    delays = ctx.hooks.node_delays(mine_node, node_ranks[mine_node].index(me), again=True)
    links: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []
    for x, y in exchanges:
        progress.set_step(ctx, f"between nodes: node {x} <-> node {y} measured again")
        send, recv, came = _pair_links(node_ranks, me, x, y)
        if came is not None:  # warm-up, untimed, as in the rounds
            _exchange(send, recv, size_bytes, 1, device, 0.0, wait_s=ctx.session.wait_s)
        # Every rank passes the repeats' barriers; ranks of neither node exchange nothing.
        received, sending = _samples((send, recv), size_bytes, iters, device, delays, repeats,
                                     ctx.session.wait_s)
        other = y if mine_node == x else x
        if received is not None and came is not None:
            links.append(_link("again", other, mine_node, came, me, received))
        if sending is not None and send is not None:
            sent.append(_sent("again", mine_node, other, me, send, sending))
        barrier(ctx.session.wait_s)
    return links, sent


def exchanges_for(suspects: Suspects) -> list[tuple[int, int]]:
    """The node pairs to measure again (unordered, each once): every slow pair's and
    every known-good reference pair's two nodes."""
    wanted = {tuple(sorted(p)) for p in (*suspects.pairs, *suspects.references)}
    return sorted((a, b) for a, b in wanted)


def run_internode(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                  device: str, threshold: float, repeats: int,
                  shifts: Sequence[int] | None = None,
                  *, ctx: RunContext) -> dict[str, Any]:
    """The rounds, gathered on every rank; then the slow node pairs (and a suspect
    node's pairs), and the node pairs of slow rail links, measured again beside
    known-good ones (gpucheck.comm.internode_verdicts, gpucheck.peers; `rail_exchanges`).
    Rank 0's list of exchanges is broadcast, so every rank runs the same steps."""
    import torch.distributed as dist

    links = _gather(measure_internode(roster, size_bytes, iters, device, repeats, shifts,
                                      ctx=ctx), ctx)
    suspects = find_node_suspects(node_samples(node_pair_rows(links)), threshold)
    wanted = sorted(set(exchanges_for(suspects)) | set(rail_exchanges(links, threshold)))
    box: list[Any] = [wanted]
    dist.broadcast_object_list(box, src=0)
    again = _gather(measure_again(roster, box[0], size_bytes, iters, device, repeats,
                                  ctx=ctx), ctx) \
        if box[0] else []
    return {"size_bytes": size_bytes, "iters": iters, "repeats": repeats, "links": links,
            "again": again}


def _gather(mine: Measured, ctx: RunContext) -> list[dict[str, Any]]:
    """Every rank's links, each with what its sender timed of it (`both_ends`)."""
    from gpucheck.comm.pairwise import gather_rows

    received, sent = mine
    links = gather_rows(received, ctx, "gathering node-to-node results",
                        ("src_node", "dst_node", "rail"))
    senders = gather_rows(sent, ctx, "gathering node-to-node results", ("src", "dst"))
    return both_ends(links, senders)
