"""`gpucheck hang`'s signals read right: py-spy 0.4's lines without a thread name (recorded
output), ranks that never move, an idle rank alone on its GPU (NVML's NotFound, the
fake following NVML), and the extremes of hang's numeric options."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpucheck.cli import main
from gpucheck.hang.findings import live_findings
from gpucheck.hang.observe import Frame, RankView, _judge_samples, parse_raw, per_process
from gpucheck.report import Status
from tests.fake_pynvml import FakeGpu, FakeNvml

PYSPY = Path(__file__).resolve().parent / "data" / "pyspy"
TRAIN = "/home/me/train.py"


def recorded(name: str) -> str:
    return (PYSPY / name).read_text()


def judged(rank: int, raw: str, world: int = 3) -> RankView:
    """A rank's view from py-spy raw output, as `watch_rank` judges it."""
    view = RankView(rank, rank, world, 100 + rank, "node7", state="sleeping",
                    state_start="sleeping", cpu_pct=0.0)
    _judge_samples(view, parse_raw(raw))
    return view


def problems(findings: list) -> list[tuple[str, Status, str | None]]:  # type: ignore[type-arg]
    return [(f.check, f.status, f.subject and f.subject.label) for f in findings
            if f.status in (Status.WARN, Status.FAIL)]


def test_py_spy_04_lines_without_a_thread_name_are_counted() -> None:
    stacks = parse_raw(recorded("unnamed_main_thread.txt"))
    assert sum(stacks.values()) == 99
    ((tid, frames),) = stacks
    assert tid == 11190 and frames[0] == Frame("load_batch", "/tmp/train_bare.py", 4)
    two = parse_raw(recorded("unnamed_two_threads.txt"))
    assert {tid for tid, _ in two} == {9076, 9086} and sum(two.values()) == 98


def test_a_thread_name_with_spaces_and_a_thread_with_no_frame_are_read() -> None:
    raw = (f"thread (0x3086): data loader 3;load (/{TRAIN}:5) 7\n"
           "thread (12): MainThread 4\n"
           "thread (12): MainThread;f (x.py:1) 99999999999999999999\n")  # no count: dropped
    stacks = parse_raw(raw)
    assert stacks[(0x3086, (Frame("load", f"/{TRAIN}", 5),))] == 7
    assert stacks[(12, ())] == 4 and sum(stacks.values()) == 11


def test_ranks_seen_only_through_unnamed_lines_are_no_all_clear() -> None:
    """Before, those lines were dropped: 0 samples and "every rank progressed"."""
    views = [judged(r, recorded("unnamed_main_thread.txt")) for r in range(3)]
    assert all(v.samples == 99 and v.steady and not v.pinned for v in views)
    assert problems(live_findings(views, 2.0, multi_node=False)) == [
        ("hang.verdict", Status.WARN, None)]


def test_every_rank_asleep_in_its_own_code_for_the_window_is_no_all_clear() -> None:
    views = [judged(r, recorded("named_sleeping_in_user_code.txt")) for r in range(3)]
    (finding,) = live_findings(views, 2.0, multi_node=False)
    assert (finding.check, finding.status, finding.action) == ("hang.verdict", Status.WARN,
                                                               "rerun")


def test_ranks_that_move_between_lines_stay_ok() -> None:
    moving = (f"thread (7): MainThread;main ({TRAIN}:6);load_batch ({TRAIN}:4) 60\n"
              f"thread (7): MainThread;main ({TRAIN}:6);forward ({TRAIN}:9) 39\n")
    views = [judged(r, moving) for r in range(3)]
    views[1] = judged(1, recorded("unnamed_main_thread.txt"))  # one rank steady: fine
    (finding,) = live_findings(views, 2.0, multi_node=False)
    assert finding.status is Status.OK


def test_a_rank_py_spy_saw_nothing_of_is_unread_not_progressed() -> None:
    empty = judged(0, "")
    assert empty.samples == 0 and (empty.stack_error or "").startswith("empty")
    views = [empty, judged(1, "")]
    (verdict,) = live_findings(views, 2.0, multi_node=False)
    assert (verdict.check, verdict.status) == ("hang.verdict", Status.SKIP)


def _eight_ranks_one_idle(monkeypatch: pytest.MonkeyPatch) -> dict[int, dict]:  # type: ignore[type-arg]
    gpus = [FakeGpu(bus_id=f"00000000:{i + 1:02x}:00.0") for i in range(8)]
    for i, gpu in enumerate(gpus):
        gpu.pids = [100 + i]
        if i != 7:  # rank 7 launched nothing: NVML has no sample of it (NotFound)
            gpu.proc_util = {100 + i: 100}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    found, note = per_process([100 + i for i in range(8)], window_s=2.0)
    assert note is None
    return found


def test_an_idle_rank_alone_on_its_gpu_reads_0_pct_and_is_named(monkeypatch) -> None:
    found = _eight_ranks_one_idle(monkeypatch)
    assert found[107]["gpu_sm_util_pct"] == 0.0 and found[100]["gpu_sm_util_pct"] == 100
    item = (f"thread (1): MainThread;step ({TRAIN}:88);item "
            "(/venv/lib/python3.11/site-packages/torch/_tensor.py:1) 99\n")
    stuck = f"thread (1): MainThread;main ({TRAIN}:6);load_batch ({TRAIN}:12) 99\n"
    views = [judged(r, item if r != 7 else stuck, world=8) for r in range(8)]
    for v in views:
        v.gpu = found[v.pid or 0]
    assert problems(live_findings(views, 2.0, multi_node=False)) == [
        ("hang.rank.user_code", Status.FAIL, "rank 7 on node7")]


def test_gpu_samples_from_before_the_window_do_not_count(monkeypatch) -> None:
    gpu = FakeGpu(pids=[4242])
    long_ago_us = int((time.time() - 60) * 1e6)  # busy a minute ago, idle since
    gpu.proc_util = {4242: (95, long_ago_us)}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]).module)
    found, _ = per_process([4242], window_s=2.0)
    assert found[4242]["gpu_sm_util_pct"] == 0.0


def test_utilisation_nvml_cannot_give_is_unknown_not_idle(monkeypatch) -> None:
    gpu = FakeGpu(pids=[4242])
    fake = FakeNvml([gpu], absent=frozenset({"nvmlDeviceGetProcessUtilization"}))
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    found, _ = per_process([4242], window_s=2.0)
    assert found[4242]["gpu_sm_util_pct"] is None


@pytest.mark.parametrize("argv", [
    ["--nvml-timeout", "1e300"], ["--nvml-timeout", "31"], ["--nvml-timeout", "1e-320"],
    ["--window", "1e300"], ["--window", "-1"], ["1099511627776"],
])
def test_extreme_numbers_are_one_line_usage_errors(argv: list[str], capsys) -> None:
    assert main(["hang", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_samples_with_no_python_frame_are_not_moving() -> None:
    native = "thread (7): MainThread 99\n"  # in native code (or between frames) throughout
    views = [judged(r, native) for r in range(3)]
    assert all(v.samples == 99 and v.moved is False for v in views)
    assert live_findings(views, 2.0, multi_node=False)[0].status is not Status.OK


