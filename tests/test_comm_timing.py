"""How comm times its ops, without a GPU: fake work handles, a fake clock and recorders
for `torch.distributed` write one log of launches, stream waits (`block`), polls under
gpucheck's deadline, waits and clock marks (`start`, `stop`, `ended`, `seconds`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from gpucheck.comm import collectives, internode, pairwise

Event = tuple[Any, ...]
# The torch.distributed function each collective calls (torch 2.14's current names).
TORCH_NAMES = {"all_reduce": "all_reduce", "all_gather": "all_gather_single",
               "reduce_scatter": "reduce_scatter_single", "all_to_all": "all_to_all_single",
               "broadcast": "broadcast"}


class Log:
    """One ordered record of launches, waits, stream waits and clock marks."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def work(self) -> FakeWork:
        return FakeWork(self, sum(1 for e in self.events if e[0] == "launch") - 1)


class FakeWork:
    def __init__(self, log: Log, number: int) -> None:
        self.log, self.number = log, number

    def wait(self) -> bool:
        self.log.events.append(("wait", self.number))
        return True

    def is_completed(self) -> bool:
        self.log.events.append(("poll", self.number))
        return True

    def block_current_stream(self) -> None:
        self.log.events.append(("block", self.number))


class FakeClock:
    def __init__(self, log: Log) -> None:
        self.log = log

    def begin(self) -> None:
        self.log.events.append(("start",))

    def mark(self) -> None:
        self.log.events.append(("stop",))

    def ended(self) -> bool:
        self.log.events.append(("ended",))
        return True

    def span_s(self) -> float:
        self.log.events.append(("seconds",))
        return 1.0


WAIT_S = 60.0  # gpucheck's deadline: never reached by these handles


def _launcher(log: Log, name: str) -> Any:
    def launch() -> FakeWork:
        log.events.append(("launch", name))
        return log.work()
    return launch


def _fake_dist(monkeypatch: pytest.MonkeyPatch, log: Log, backend: str, rank: int = 0) -> None:
    """Replace the torch.distributed calls comm makes with recorders (2 ranks)."""
    def collective(name: str) -> Any:
        def call(*args: Any, async_op: bool = False, **kwargs: Any) -> FakeWork | None:
            log.events.append(("launch", name, async_op))
            return log.work() if async_op else None  # a synchronous call waits inside
        return call

    def p2p(name: str) -> Any:
        def call(tensor: Any, peer: int, *args: Any, **kwargs: Any) -> FakeWork | None:
            log.events.append(("launch", name, peer))
            return log.work() if name in ("isend", "irecv") else None
        return call

    # raising=False: torch 2.11 has no all_gather_single / reduce_scatter_single (comm
    # then calls the older names, which this test does not exercise).
    for name in TORCH_NAMES.values():
        monkeypatch.setattr(dist, name, collective(name), raising=False)
    for name in ("isend", "irecv", "send", "recv"):
        monkeypatch.setattr(dist, name, p2p(name))
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: log.events.append(("barrier",)))
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: backend)
    # NCCL's barrier names the rank's GPU, the current CUDA device (none on this machine).
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # raising=False: the fake clock is only looked up where the code has a clock factory.
    for module in (collectives, pairwise):
        monkeypatch.setattr(module, "make_clock", lambda device: FakeClock(log),
                            raising=False)


def _time_pair(iters: int) -> list[float]:
    """One timed batch of 4 KiB from rank 0 to rank 1, through comm's pair timing."""
    return pairwise._time_pair_samples(0, 1, 4096, iters, "cpu", 1, WAIT_S)


def _kinds(events: list[Event]) -> list[str]:
    return [e[0] for e in events]


def test_a_long_batch_polls_the_op_max_in_flight_launches_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "MAX_IN_FLIGHT", 2)
    log = Log()
    collectives.time_batch([_launcher(log, "op")] * 5, FakeClock(log), back_to_back=True,
                           wait_s=WAIT_S)
    launched_before_stop = log.events[:log.events.index(("stop",))]
    assert launched_before_stop == [
        ("start",), ("launch", "op"), ("launch", "op"), ("poll", 0), ("launch", "op"),
        ("poll", 1), ("launch", "op"), ("poll", 2), ("launch", "op"),
        *[("block", n) for n in range(5)]]
    assert log.events[-1] == ("seconds",) and _kinds(log.events).count("seconds") == 1


@pytest.mark.parametrize(("collective", "torch_name"), sorted(TORCH_NAMES.items()))
def test_the_nccl_timed_loop_launches_every_op_async_and_polls_once_at_the_end(
        monkeypatch: pytest.MonkeyPatch, collective: str, torch_name: str) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl")
    iters = 5
    timing = collectives.measure(collective, 1024, iters, 2, "cpu", WAIT_S)
    timed = log.events[log.events.index(("start",)):]
    launches = [e for e in timed if e[0] == "launch"]
    # The timed ops, then the one call that checks the result, polled the same way.
    assert launches == [("launch", torch_name, True)] * (iters + 1)
    first_poll = _kinds(timed).index("poll")
    assert _kinds(timed[:first_poll]).count("launch") == iters
    assert _kinds(timed) == ["start", *["launch"] * iters, *["block"] * iters, "stop",
                             *["poll"] * (iters + 1), "ended", *["wait"] * (iters + 1),
                             "seconds", "launch", "block", "poll", "wait"]
    assert timing.time_s == pytest.approx(1.0 / iters)


def test_the_nccl_clock_starts_on_the_stream_after_an_untimed_all_reduce_of_every_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks leave the host barrier up to ~1 ms apart (blocking wait polls every 1 ms):
    the start mark must come after a device-side rendezvous, or the first rank out
    counts the wait for the last one."""
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl")
    collectives.measure("all_gather", 1024, 3, 1, "cpu", WAIT_S)
    after_barrier = log.events[log.events.index(("barrier",)) + 1:]
    assert after_barrier[:3] == [("launch", "all_reduce", True), ("block", 1), ("start",)]
    rendezvous_poll = after_barrier.index(("poll", 1))
    assert rendezvous_poll > after_barrier.index(("stop",))  # polled with the timed ops
    assert rendezvous_poll < after_barrier.index(("seconds",))  # bounded before the read


def test_the_nccl_warm_up_runs_as_one_batch_before_the_barrier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl")
    collectives.measure("all_reduce", 1024, 1, 3, "cpu", WAIT_S)
    warm = log.events[:log.events.index(("barrier",))]
    assert _kinds(warm) == [*["launch"] * 3, *["block"] * 3, *["poll"] * 3, *["wait"] * 3]


def test_the_gloo_timed_loop_waits_on_each_op_before_launching_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="gloo")
    collectives.measure("all_reduce", 1024, 3, 0, "cpu", WAIT_S)
    timed = log.events[log.events.index(("barrier",)) + 1:]
    assert _kinds(timed) == ["start", "launch", "wait", "launch", "wait", "launch", "wait",
                             "stop", "seconds", "launch", "wait"]


def test_the_nccl_pair_sender_aligns_then_launches_every_send_and_the_ack_before_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl", rank=0)
    iters = 3
    (gbps,) = _time_pair(iters)
    launches = [e for e in log.events if e[0] == "launch"]
    # Warm-up (one send and the ack: it connects the pair), the untimed alignment
    # (the receiver's one element), then the timed batch.
    assert launches == [("launch", "isend", 1), ("launch", "irecv", 1),
                        ("launch", "irecv", 1),
                        *[("launch", "isend", 1)] * iters, ("launch", "irecv", 1)]
    timed = log.events[log.events.index(("start",)):]
    assert _kinds(timed) == ["start", *["launch"] * (iters + 1), *["block"] * (iters + 1),
                             "stop", *["poll"] * (iters + 2), "ended",
                             *["wait"] * (iters + 2), "seconds"]
    assert gbps == pytest.approx(4096 * iters / 1.0 / 1e9)
    # The sender leaves the host barrier up to ~1 ms before the receiver: its start mark
    # follows the receiver's untimed element, which its stream waits on (ops 0, 1: the
    # warm-up), so the skew is not counted; that op is polled, bounded, after the stop.
    start = log.events.index(("start",))
    assert log.events[start - 2:start] == [("launch", "irecv", 1), ("block", 2)]
    assert log.events.index(("poll", 2)) > log.events.index(("stop",))


def test_the_nccl_pair_receiver_posts_every_receive_and_the_ack_before_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl", rank=1)
    assert _time_pair(3) == []
    timed = log.events[_kinds(log.events).index("wait") + 2:]  # after the warm-up's waits
    # The alignment's one-element send to the sender, then the batch.
    assert [e for e in timed if e[0] == "launch"] == [("launch", "isend", 0)] + [
        ("launch", "irecv", 0)] * 3 + [("launch", "isend", 0)]
    assert _kinds(timed) == ["launch", "block", *["launch"] * 4, *["block"] * 4,
                             *["poll"] * 5, *["wait"] * 5]
    assert "start" not in _kinds(log.events)  # only the sender keeps time


def test_the_gloo_pair_is_timed_one_op_at_a_time_without_an_alignment_op(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="gloo", rank=0)
    _time_pair(2)
    timed = log.events[log.events.index(("start",)):]
    assert _kinds(timed) == ["start", "launch", "wait", "launch", "wait", "launch", "wait",
                             "stop", "seconds"]


def _fake_batches(monkeypatch: pytest.MonkeyPatch, log: Log) -> None:
    """batch_isend_irecv as a recorder: one launch per group, one handle per op."""
    def p2p_op(op: Any, tensor: Any, peer: int) -> tuple[str, int, int]:
        return ("isend" if op is dist.isend else "irecv", peer, tensor.numel())
    monkeypatch.setattr(dist, "P2POp", p2p_op)

    def batch(ops: list[Any]) -> list[FakeWork]:
        log.events.append(("launch", "group", tuple(ops)))
        number = sum(1 for e in log.events if e[0] == "launch") - 1
        return [FakeWork(log, number)] * len(ops)
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    monkeypatch.setattr(internode, "make_clock", lambda device: FakeClock(log))


def test_the_nccl_exchange_between_nodes_starts_its_clock_after_an_aligned_one_element_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl", rank=1)
    _fake_batches(monkeypatch, log)
    timed = internode._exchange(2, 0, 4096, 3, "cpu", wait_s=WAIT_S)
    groups = [e for e in log.events if e[0] == "launch"]
    # The alignment: one element from the sender (rank 0) and to the receiver (rank 2).
    assert groups[0] == ("launch", "group", (("irecv", 0, 1), ("isend", 2, 1)))
    assert groups[1] == ("launch", "group", (("irecv", 0, 1024),) * 3 + (("isend", 2, 1024),) * 3)
    start = log.events.index(("start",))
    assert log.events[start - 1] == ("block", 0) and log.events[start + 1] == groups[1]
    assert log.events.index(("poll", 0)) > log.events.index(("stop",))
    # One group ends when both directions have: its time is reported for the link
    # received on and for the link sent on (internode_verdicts.both_ends).
    assert timed == internode.Exchange(1.0, 1.0)


def test_a_rank_that_only_sends_between_nodes_times_its_group_for_the_link_it_sent_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    _fake_dist(monkeypatch, log, backend="nccl", rank=1)
    _fake_batches(monkeypatch, log)
    assert internode._exchange(2, None, 4096, 2, "cpu", wait_s=WAIT_S) == \
        internode.Exchange(None, 1.0)
    assert _kinds(log.events).count("start") == 1
    assert [e[2] for e in log.events if e[0] == "launch"] == [
        (("isend", 2, 1),), (("isend", 2, 1024),) * 2]


def test_gloo_times_the_receives_alone_and_has_no_alignment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gloo = Log()
    _fake_dist(monkeypatch, gloo, backend="gloo", rank=1)
    timed = internode._exchange(2, 0, 4096, 2, "cpu", wait_s=WAIT_S)
    assert [e[1] for e in gloo.events if e[0] == "launch"] == ["irecv", "irecv", "isend",
                                                                "isend"]
    # A gloo send is done when handed over, not when received: it times nothing.
    assert timed.received_s is not None and timed.received_s >= 0
    assert timed.sent_s is None


def test_the_untimed_rendezvous_counts_as_one_op_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "MAX_IN_FLIGHT", 2)
    log = Log()
    collectives.time_batch([_launcher(log, "op")] * 2, FakeClock(log), back_to_back=True,
                           wait_s=WAIT_S, align=_launcher(log, "rendezvous"))
    assert log.events[:7] == [("launch", "rendezvous"), ("block", 0), ("start",),
                              ("launch", "op"), ("poll", 0), ("launch", "op"), ("block", 1)]
