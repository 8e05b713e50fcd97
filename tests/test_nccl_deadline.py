"""gpucheck's own deadline on NCCL host waits, the backstop settings, and how a rank
whose NCCL group failed ends (gpucheck.distributed.deadline; issue 33), on fakes:
handles and a store that never complete, fake clocks, nothing slept for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpucheck.comm import collectives
from gpucheck.context import RunContext
from gpucheck.distributed import checkin, deadline, progress, session
from gpucheck.distributed.world import World


class FakeClock:
    """Time moves only when the code sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Stuck:
    """A Work whose op never completes (a silent peer)."""

    def __init__(self, done_after_polls: int | None = None) -> None:
        self.polls, self.done_after = 0, done_after_polls

    def is_completed(self) -> bool:
        self.polls += 1
        return self.done_after is not None and self.polls > self.done_after

    def wait(self) -> bool:
        return True

    def block_current_stream(self) -> None:
        pass


def test_a_wait_ends_at_the_deadline_unless_its_op_completes_first() -> None:
    clock = FakeClock()
    with pytest.raises(deadline.DeadlinePassed, match="timed out"):
        deadline.settle([Stuck()], 3.0, "an all_reduce", clock=clock, sleep=clock.sleep)
    assert 3.0 <= clock.now - 1000.0 < 3.0 + 2 * deadline.POLL_S
    clock = FakeClock()
    deadline.settle([Stuck(done_after_polls=3)], 3.0, "an all_reduce", clock=clock,
                    sleep=clock.sleep)
    assert clock.now - 1000.0 < 3.0


def test_a_timed_batch_with_a_silent_peer_raises_after_its_end_mark() -> None:
    marks: list[str] = []

    class Clock(collectives.NullClock):
        def mark(self) -> None:
            marks.append("stop")

    with pytest.raises(deadline.DeadlinePassed) as raised:
        collectives.time_batch([Stuck] * 3, Clock(), back_to_back=True, wait_s=0.0)
    assert marks == ["stop"] and session.is_comm_error(raised.value)


def test_the_backstop_sets_only_what_the_user_did_not() -> None:
    env = {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}
    chosen = deadline.nccl_backstop(env)
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" not in chosen
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600"
    assert chosen == {k: v for k, v in deadline.BACKSTOP.items()
                      if k != "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert "TORCH_NCCL_BLOCKING_WAIT" not in env  # it would start no watchdog


def test_the_nccl_group_timeout_is_behind_gpuchecks_deadline_and_gloos_is_it() -> None:
    assert deadline.group_timeout_s("nccl", 3.0) == 3.0 + deadline.BACKSTOP_S
    assert deadline.group_timeout_s("gloo", 3.0) == 3.0


def test_the_nccl_roll_call_window_follows_the_settings_in_effect(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "3000")
    short = checkin.roll_call_window_s(3.0, "nccl")
    assert short == deadline.BACKSTOP_S + deadline.TRACEBACK_CAP_S + 12 + deadline.DUMP_WAIT_S
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "15000")
    assert checkin.roll_call_window_s(3.0, "nccl") == short + 48
    assert checkin.roll_call_window_s(3.0, "gloo") < short


class FakeStore:
    """A c10d store on a fake clock: `arrivals` maps a key to when it appears."""

    def __init__(self, clock: FakeClock, arrivals: dict[str, float] | None = None) -> None:
        self.clock, self.keys = clock, dict(arrivals or {})

    def set_timeout(self, timeout: Any) -> None:
        pass

    def set(self, key: str, value: str) -> None:
        self.keys[key] = self.clock.now

    def check(self, keys: list[str]) -> bool:
        return all(self.keys.get(k, float("inf")) <= self.clock.now for k in keys)


def _alive(rank: int) -> str:
    return checkin._key("alive", rank)


def _read(rank: int) -> str:
    return checkin._key("read", rank)


@pytest.mark.parametrize(("arrivals", "missing"), [
    ({_alive(1): 40.0, _read(1): 40.0}, [2]),  # a late survivor within the window
    ({_alive(1): 0.0, _alive(2): 1.0}, []),  # every rank answers
])
def test_the_roll_call_names_only_the_ranks_that_never_answered_within_its_window(
        arrivals: dict[str, float], missing: list[int]) -> None:
    clock = FakeClock()
    store = FakeStore(clock, {key: clock.now + at for key, at in arrivals.items()})
    assert checkin.roll_call(store, 0, 3, 55.0, clock=clock, sleep=clock.sleep) == missing


def test_the_stores_host_stays_until_every_rank_that_answered_has_read() -> None:
    clock = FakeClock()
    store = FakeStore(clock, {_alive(1): clock.now, _read(1): clock.now + 20.0})
    missing = checkin.roll_call(store, 0, 3, 10.0, host=True, clock=clock,
                                sleep=clock.sleep)
    assert missing == [2] and clock.now - 1000.0 >= 20.0


class FakeC10d:
    def __init__(self, with_function: bool, group_abort: bool = True,
                 fails: bool = False) -> None:
        self.calls: list[str] = []
        if with_function:
            self._abort_process_group = self._whole
        self.fails, self.group_abort = fails, group_abort

    def _whole(self) -> None:
        if self.fails:
            raise RuntimeError("ncclCommAbort failed")
        self.calls.append("_abort_process_group")

    def _get_default_group(self) -> Any:
        c10d = self

        class Group:
            def abort(self) -> None:
                c10d.calls.append("group.abort")
        return Group() if self.group_abort else object()


class FakeDist:
    def __init__(self, c10d: FakeC10d) -> None:
        self.distributed_c10d = c10d


@pytest.mark.parametrize(("c10d", "calls"), [
    (FakeC10d(with_function=True), ["_abort_process_group"]),  # where torch has it
    (FakeC10d(with_function=False), ["group.abort"]),  # else the group's own abort
    (FakeC10d(with_function=False, group_abort=False), None),  # neither: said
    (FakeC10d(with_function=True, fails=True), None),  # failed: said, never swallowed
])
def test_abort_uses_what_this_torch_has_and_says_why_not(c10d: FakeC10d,
                                                         calls: list[str] | None) -> None:
    why = deadline.abort_groups(FakeDist(c10d))
    assert (why is None, c10d.calls) == (calls is not None, calls or [])


def test_a_command_that_aborted_nothing_returns_its_code() -> None:
    left: list[int] = []
    assert deadline.exit_after_abort(lambda: False, lambda: 0, left.append) == 0
    assert left == []


def _two_ranks() -> World:
    return World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                 master_addr="127.0.0.1", master_port=1, launcher="torchrun")


def test_on_the_deadline_a_rank_dumps_answers_aborts_reports_then_exits(
        monkeypatch, tmp_path: Path) -> None:
    """The order of issue 33: the dump while the stuck op still reads started, the
    roll call, the abort, the report, os._exit with the command's code."""
    order: list[Any] = []
    monkeypatch.setattr(deadline, "dump_after_failure", lambda rank, backend: (
        order.append("dump"), deadline.DumpOutcome(path=str(tmp_path / "x_gpucheck_1")))[1])
    monkeypatch.setattr(session, "roll_call", lambda *a, **k: (order.append("roll call"),
                                                               [0])[1])
    monkeypatch.setattr(deadline, "abort_groups", lambda dist: order.append("abort"))
    monkeypatch.setattr(progress, "record_diagnosis",
                        lambda ctx, d: order.append(("diagnosis", d["missing"])))
    ctx = RunContext()
    ctx.session.backstop = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    stuck = deadline.DeadlinePassed("an all_reduce timed out")
    (error,) = session._after_failure(ctx, object(), _two_ranks(), 3.0, stuck,
                                      "nccl") or []
    assert isinstance(error, checkin.RanksUnresponsive) and error.missing == [0]

    def report() -> int:
        order.append("report")
        return 1
    deadline.exit_after_abort(lambda: ctx.session.aborted, report,
                              lambda code: order.append(("exit", code)))
    assert order == ["dump", "roll call", "abort", ("diagnosis", [0]), "report", ("exit", 1)]


def test_a_gloo_failure_dumps_and_answers_but_aborts_nothing(monkeypatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(deadline, "dump_after_failure",
                        lambda rank, backend: order.append("dump"))
    monkeypatch.setattr(session, "roll_call", lambda *a, **k: (order.append("roll call"),
                                                               [])[1])
    monkeypatch.setattr(deadline, "abort_groups", lambda dist: order.append("abort"))
    monkeypatch.setattr(progress, "record_diagnosis", lambda ctx, d: None)
    ctx = RunContext()
    session._after_failure(ctx, object(), _two_ranks(), 3.0, RuntimeError("gloo timed out"),
                           "gloo")
    assert order == ["dump", "roll call"] and not ctx.session.aborted


def test_gpuchecks_dump_never_replaces_the_file_torch_wrote(monkeypatch,
                                                            tmp_path: Path) -> None:
    prefix = str(tmp_path / "comm_rank_")
    (tmp_path / "comm_rank_0").write_bytes(b"torch's own dump")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", prefix)
    monkeypatch.setattr(deadline, "dumper", lambda backend: (lambda: b"gpucheck's", None))
    outcome = deadline.dump_after_failure(0, "nccl")
    assert outcome == deadline.DumpOutcome(path=deadline.own_path(prefix, 0))
    assert (tmp_path / "comm_rank_0").read_bytes() == b"torch's own dump"
    assert Path(deadline.own_path(prefix, 0)).read_bytes() == b"gpucheck's"


def test_the_dump_is_asked_without_stack_traces(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    asked: list[dict[str, Any]] = []

    def fake(**kwargs: Any) -> bytes:
        asked.append(kwargs)
        return b""
    monkeypatch.setattr(torch._C._distributed_c10d, "_dump_fr_trace", fake)
    function, _ = deadline.dumper("gloo")
    assert function is not None and function() == b""
    assert asked == [{"includeStackTraces": False}]


def test_the_timeout_probe_dry_run_ends_through_the_deadline_and_leaves_a_dump(
        tmp_path: Path) -> None:
    """benchmarks/nccl_timeout_probe.py on the CPU (gloo, a stand-in op held back past
    the timeout): the rank raises gpucheck's DeadlinePassed, dumps, exits 1, and the
    probe records it all; the GPU run is the same script without --dry-run."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "benchmarks/nccl_timeout_probe.py", "--dry-run",
                           "--out", str(tmp_path), "--timeout", "1", "--sleep", "30"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "probe.json").read_text())
    assert result["rank"]["exit_code"] == 1 and result["rank"]["killed_after_s"] is None
    assert result["rank"]["raised"]["type"] == "DeadlinePassed"
    assert result["dumps"]["gpucheck"]["exists"] and not result["dumps"]["torch"]["exists"]
    assert result["hang_traces"]["exit_code"] == 0
    assert [f[0] for f in result["hang_traces"]["findings"]] == ["hang.traces.agree"]


def test_the_failure_section_lists_the_nccl_settings_gpucheck_chose_and_only_those() -> None:
    from gpucheck.distributed.job import failure_section

    chose = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    nccl = failure_section("comm", [], False, "rank 1 did not answer",
                           [{"rank": 0, "missing": [1], "nccl_settings": chose}])
    gloo = failure_section("comm", [], False, "rank 1 did not answer",
                           [{"rank": 0, "missing": [1], "nccl_settings": None}])
    assert nccl.data["nccl_set_by_gpucheck"] == chose
    assert "nccl_set_by_gpucheck" not in gloo.data


class _Event:
    """A torch.cuda.Event stand-in: complete after `after` queries (never when None)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.queries, self.recorded = after, 0, False

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        self.queries += 1
        return self.after is not None and self.queries > self.after


@pytest.mark.parametrize("after", [0, 3])
def test_a_device_sync_returns_once_its_end_event_completes(
        monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    import torch

    event = _Event(after)
    monkeypatch.setattr(torch.cuda, "Event", lambda: event)
    deadline.synchronize("cuda", 60.0, "the timed loop")
    assert event.recorded and event.queries == after + 1


def test_a_device_sync_behind_a_hung_collective_ends_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "Event", lambda: _Event(None))
    with pytest.raises(deadline.DeadlinePassed, match="the timed loop timed out"):
        deadline.synchronize("cuda", 0.02, "the timed loop")


def test_a_cpu_rank_has_no_device_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "Event", lambda: pytest.fail("no event on CPU"))
    deadline.synchronize("cpu", 0.0, "the timed loop")
