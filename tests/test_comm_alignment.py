"""Why comm's NCCL batch starts on the device: a simulated two-rank timeline.

No GPU and no clock: each rank's calls into `collectives.time_batch` are recorded as
a stream of ops and event marks, with the host time at which each was issued; then
the timeline is resolved as NCCL runs it (a collective ends on every rank at the
same moment, `OP_US` after the last rank's stream reached it). The ranks leave the
barrier SKEW_US apart, as under blocking wait's 1 ms host polling. Without the
untimed rendezvous the early rank's window holds the skew; with it, both windows are
exactly the ops' device time.
"""

from __future__ import annotations

from typing import Any

from gpucheck.comm import collectives

OP_US = 20.0  # one collective on the device
LAUNCH_US = 5.0  # host time per launch or event record
SKEW_US = 1000.0  # rank 1 leaves the barrier this much after rank 0
ITERS = 4


class SimRank:
    """One rank's host clock and the stream items it issued, in order."""

    def __init__(self, host_us: float) -> None:
        self.host_us = host_us
        self.stream: list[tuple[str, float]] = []  # ("op" | "start" | "stop", host time)
        self.events: dict[str, float] = {}

    def issue(self, kind: str) -> None:
        self.stream.append((kind, self.host_us))
        self.host_us += LAUNCH_US


class SimWork:
    def wait(self) -> None:  # the host waits after the end mark: nothing to simulate
        pass

    def is_completed(self) -> bool:
        return True

    def block_current_stream(self) -> None:  # one stream per rank in this model
        pass


class SimClock:
    def __init__(self, rank: SimRank) -> None:
        self.rank = rank

    def begin(self) -> None:
        self.rank.issue("start")

    def mark(self) -> None:
        self.rank.issue("stop")

    def ended(self) -> bool:
        return True

    def span_s(self) -> float:
        return 0.0  # read after `resolve`, from rank.events


def _launcher(rank: SimRank) -> Any:
    def launch() -> SimWork:
        rank.issue("op")
        return SimWork()
    return launch


def resolve(ranks: list[SimRank]) -> None:
    """Run the streams: the k-th op of every rank is one collective."""
    tails = [0.0] * len(ranks)
    cursors = [0] * len(ranks)
    while True:
        for r, rank in enumerate(ranks):  # event marks: when the stream reaches them
            while cursors[r] < len(rank.stream) and rank.stream[cursors[r]][0] != "op":
                kind, host = rank.stream[cursors[r]]
                tails[r] = max(tails[r], host)
                rank.events[kind] = tails[r]
                cursors[r] += 1
        if any(c == len(rank.stream) for c, rank in zip(cursors, ranks, strict=True)):
            return
        ready = [max(tails[r], rank.stream[cursors[r]][1]) for r, rank in enumerate(ranks)]
        done = max(ready) + OP_US
        tails = [done] * len(ranks)
        cursors = [c + 1 for c in cursors]


def windows_us(align: bool) -> list[float]:
    ranks = [SimRank(0.0), SimRank(SKEW_US)]
    for rank in ranks:
        collectives.time_batch([_launcher(rank)] * ITERS, SimClock(rank), back_to_back=True,
                               wait_s=60.0, align=_launcher(rank) if align else None)
    resolve(ranks)
    return [rank.events["stop"] - rank.events["start"] for rank in ranks]


def test_without_the_rendezvous_the_first_rank_out_of_the_barrier_counts_the_skew() -> None:
    early, late = windows_us(align=False)
    assert early == late + SKEW_US  # the reported (slowest) rank reads the skew as op time


def test_with_the_rendezvous_every_rank_times_only_the_ops() -> None:
    assert windows_us(align=True) == [ITERS * OP_US, ITERS * OP_US]
