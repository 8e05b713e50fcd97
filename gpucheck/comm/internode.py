"""Node-to-node bandwidth in N - 1 parallel rounds, all rails at once, then the slow node
pairs measured again beside known-good ones (docs/comm.md, "Between nodes")."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from gpucheck.comm.collectives import Work, make_clock, started, time_batch
from gpucheck.comm.internode_verdicts import (
    both_ends,
    find_node_suspects,
    node_pair_rows,
    node_samples,
    rail_exchanges,
)
from gpucheck.comm.records import LinkRow, SentRow, crossing
from gpucheck.comm.verdicts import ELEMENT_BYTES, GB
from gpucheck.confirm import remeasure
from gpucheck.context import RunContext
from gpucheck.distributed.deadline import synchronize
from gpucheck.peers import Suspects


def round_schedule(nodes: int, shifts: Sequence[int] | None = None,
                   ) -> list[list[tuple[int, int]]]:
    """Round r (1 .. nodes-1): every node i sends to (i + r) mod nodes; with `shifts`,
    only those rounds (preflight's constant number of rounds)."""
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


class Exchange(NamedTuple):
    """One timed exchange on one rank: seconds until its receives were done, and seconds
    that cover its sends (None: none, or gloo, whose sends end when handed over)."""

    received_s: float | None
    sent_s: float | None


def _exchange(me_send: int | None, me_recv: int | None, size_bytes: int, iters: int,
              device: str, *, wait_s: float) -> Exchange:
    """Send `iters` buffers to `me_send` while receiving as many from `me_recv`."""
    import torch
    import torch.distributed as dist

    where = "cuda" if device == "cuda" else "cpu"
    count = max(size_bytes // ELEMENT_BYTES, 1)
    out, into = torch.zeros(count, device=where), torch.zeros(count, device=where)
    synchronize(device)
    if str(dist.get_backend()) == "nccl":
        if me_send is None and me_recv is None:
            return Exchange(None, None)
        # One group of every send and receive, timed on the device from a start aligned
        # by an untimed one-element exchange with the same peers.
        peers = (me_send, me_recv)
        seconds = time_batch([_batch(peers, out, into, iters)], make_clock(device), True,
                             wait_s, _batch(peers, out[:1].clone(), into[:1].clone(), 1))
        return Exchange(seconds if me_recv is not None else None,
                        seconds if me_send is not None else None)
    began = time.perf_counter()
    posted = [dist.irecv(into, me_recv) for _ in range(iters)] if me_recv is not None else []
    # A helper thread waits on the receives, so this rank's own (possibly slow) sends
    # do not delay the moment its receives are seen done.
    ended: list[float] = []
    waiter = threading.Thread(target=_wait_all, args=(posted, ended), daemon=True)
    waiter.start()
    for _ in range(iters if me_send is not None else 0):
        started(dist.isend(out, me_send)).wait()
    waiter.join()
    if len(ended) != 1:
        raise RuntimeError("a receive between nodes failed (see the rank's error)")
    return Exchange(ended[0] - began if me_recv is not None else None, None)


def _wait_all(works: Sequence[Any], ended: list[float]) -> None:
    for work in works:
        work.wait()
    ended.append(time.perf_counter())


Samples = tuple[list[float] | None, list[float] | None]  # GB/s received, sent per repeat


def _samples(peers: tuple[int | None, int | None], size_bytes: int, iters: int,
             device: str, repeats: int, wait_s: float) -> Samples:
    """`repeats` timed exchanges, each after a barrier: GB/s as received and as sent
    (None: no receive, or no timed send)."""
    from gpucheck.distributed.session import barrier

    timed = []
    for _ in range(repeats):
        # Every repeat starts together: without the barrier a rank that waited on a slow
        # peer would start its next sends late, and its own receivers would read slow.
        barrier(wait_s)
        timed.append(_exchange(*peers, size_bytes, iters, device, wait_s=wait_s))

    def gbps(seconds: list[float | None]) -> list[float] | None:
        if not seconds or any(s is None or s <= 0 for s in seconds):
            return None
        return [round(size_bytes * iters / s / GB, 4) for s in seconds if s is not None]
    return gbps([t.received_s for t in timed]), gbps([t.sent_s for t in timed])


Measured = tuple[list[LinkRow], list[SentRow]]  # links received on, sent on


# A step of this rank: its rows' round, the progress words, the node it sends to and the
# node it receives from (None: neither, in a second look of other nodes).
Step = tuple[int | str, str, int | None, int | None]


def _measure(roster: Sequence[Mapping[str, Any]],
             steps: Callable[[int, int], Iterator[Step]], size_bytes: int, iters: int,
             device: str, repeats: int, *, again: bool, ctx: RunContext) -> Measured:
    """Each step's exchange, every rank passing its barriers: the rounds end with one, a
    second look's exchanges have one each."""
    import torch.distributed as dist

    from gpucheck.distributed import progress
    from gpucheck.distributed.nodes import group_by_node
    from gpucheck.distributed.session import barrier

    me = dist.get_rank()
    node_ranks = list(group_by_node(roster).values())
    mine = next(i for i, ranks in enumerate(node_ranks) if me in ranks)
    links: list[LinkRow] = []
    sent: list[SentRow] = []
    for label, text, to_node, from_node in steps(len(node_ranks), mine):
        progress.set_step(ctx, text)
        send = None if to_node is None else \
            {s: d for _, s, d in rail_links(node_ranks, mine, to_node)}.get(me)
        came = None if from_node is None else \
            {d: (k, s) for k, s, d in rail_links(node_ranks, from_node, mine)}.get(me)
        peers = (send, came[1] if came is not None else None)
        if came is not None or not again:
            # Warm-up, untimed: NCCL's first send/recv between two ranks creates their
            # communicator, which must not be inside the timed exchange.
            _exchange(*peers, size_bytes, 1, device, wait_s=ctx.session.wait_s)
        received, sending = _samples(peers, size_bytes, iters, device, repeats,
                                     ctx.session.wait_s)
        if received is not None and came is not None and from_node is not None:
            links.append(LinkRow(
                round=label, src_node=from_node, dst_node=mine, rail=came[0], src=came[1],
                dst=me, bandwidth_gbps=statistics.median(received),
                samples_gbps=tuple(received)))
        if sending is not None and send is not None and to_node is not None:
            # What this rank's timing says of the link it sent on (NCCL: its group's time).
            sent.append(SentRow(round=label, src_node=mine, dst_node=to_node, src=me,
                                dst=send, sent_gbps=tuple(sending)))
        if again:
            barrier(ctx.session.wait_s)
    if not again:
        barrier(ctx.session.wait_s)
    return links, sent


def exchanges_for(suspects: Suspects) -> list[tuple[int, int]]:
    """The node pairs (unordered) of every slow pair and every known-good reference pair."""
    wanted = {tuple(sorted(p)) for p in (*suspects.pairs, *suspects.references)}
    return sorted((a, b) for a, b in wanted)


def run_internode(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                  device: str, threshold: float, repeats: int,
                  shifts: Sequence[int] | None = None,
                  *, ctx: RunContext) -> dict[str, Any]:
    """Every round (or only `shifts`) gathered on every rank: the links received on, each
    with what its sender timed of it (NCCL); then the exchanges rank 0 plans (slow node
    pairs, a suspect node's, slow rail links') measured again (`confirm.remeasure`)."""
    import torch.distributed as dist

    def rounds(nodes: int, mine: int) -> Iterator[Step]:
        for pairs in round_schedule(nodes, shifts):
            r = (pairs[0][1] - pairs[0][0]) % nodes  # the round's shift
            yield r, f"between nodes: round {r}", (mine + r) % nodes, (mine - r) % nodes

    links = _gather(_measure(roster, rounds, size_bytes, iters, device, repeats, again=False,
                             ctx=ctx), ctx)

    def planned() -> list[tuple[int, int]]:
        suspects = find_node_suspects(node_samples(node_pair_rows(links)), threshold)
        return sorted(set(exchanges_for(suspects)) | set(rail_exchanges(links, threshold)))

    def again(wanted: list[tuple[int, int]]) -> list[LinkRow]:
        # Each exchange alone (both ways, all rails), a barrier of all ranks around each.
        def alone(nodes: int, mine: int) -> Iterator[Step]:
            for x, y in wanted:
                other = y if mine == x else x if mine == y else None
                yield "again", f"between nodes: node {x} <-> node {y} measured again", \
                    other, other
        return _gather(_measure(roster, alone, size_bytes, iters, device, repeats, again=True,
                                ctx=ctx), ctx)

    second = remeasure(dist.get_rank(), planned, again, ctx)[1]
    return {"size_bytes": size_bytes, "iters": iters, "repeats": repeats,
            "links": [crossing(x) for x in links], "again": [crossing(x) for x in second or []]}


def _gather(mine: Measured, ctx: RunContext) -> list[LinkRow]:
    """Every rank's links, each with what its sender timed of it (`both_ends`)."""
    from gpucheck.comm.pairwise import gather_rows

    received, sent = mine
    links = gather_rows(received, ctx, "gathering node-to-node results",
                        ("src_node", "dst_node", "rail"))
    senders = gather_rows(sent, ctx, "gathering node-to-node results", ("src", "dst"))
    return both_ends(links, senders)
