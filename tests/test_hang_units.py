"""`gpucheck hang` without a job: the verdict on given rank views, py-spy's formats
(recorded output of py-spy 0.4 too), the environment allowlist, the ptrace SKIP, NVML per
process (an idle rank alone on its GPU), usage errors and extreme numbers, renderers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucheck.cli import main
from gpucheck.hang.findings import live_findings
from gpucheck.hang.live import ranks_section
from gpucheck.hang.observe import (
    Frame,
    RankView,
    Site,
    _judge_samples,
    parse_raw,
    per_process,
    site_of,
)
from gpucheck.hang.procs import ALLOWED, RankProcess, missing_local_ranks, rank_of
from gpucheck.render import render
from gpucheck.report import Report, Status
from tests.comm_workers import clean_env
from tests.fake_pynvml import FakeGpu, FakeNvml

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/me/train.py"
ALL_REDUCE = Site("collective", "all_reduce", f"step at {TRAIN}:40",
                  "all_reduce at torch/distributed/distributed_c10d.py:4181")


def view(rank: int, site: Site | None, pinned: bool, state: str = "sleeping",
         **fields: object) -> RankView:
    v = RankView(rank, rank, 3, 100 + rank, "node7", state=state, state_start=state,
                 cpu_pct=0.0, site=None if site is None else site.__dict__, pinned=pinned,
                 samples=100)
    for key, value in fields.items():
        setattr(v, key, value)
    return v


def user(where: str) -> Site:
    return Site("user", None, where, where)


def failing(findings: list) -> list[tuple[str, str | None]]:  # type: ignore[type-arg]
    return [(f.check, f.subject and f.subject.label) for f in findings
            if f.status in (Status.WARN, Status.FAIL)]


def test_py_spy_raw_lines_become_per_thread_stacks_innermost_first() -> None:
    raw = (f"thread (12429): MainThread;<module> ({TRAIN}:9);main ({TRAIN}:8) 48\n"
           "thread (0x3086): side;run (/usr/lib/python3.11/threading.py:982) 2\n"
           "garbage line\n")
    stacks = parse_raw(raw)
    assert stacks[(12429, (Frame("main", TRAIN, 8), Frame("<module>", TRAIN, 9)))] == 48
    assert sum(stacks.values()) == 50


def test_a_collective_is_named_by_the_op_and_the_users_call_site() -> None:
    frames = (Frame("all_reduce", C10D, 4181), Frame("wrapper", LOGGER, 83),
              Frame("step", TRAIN, 40), Frame("<module>", TRAIN, 90))
    assert site_of(frames) == ALL_REDUCE
    inner = (Frame("wait", "/usr/lib/python3.11/threading.py", 320),
             Frame("load_batch", TRAIN, 12))
    assert site_of(inner).where == f"load_batch at {TRAIN}:12"


def test_the_rank_outside_the_collective_is_named_with_its_line() -> None:
    views = [view(0, ALL_REDUCE, True), view(1, ALL_REDUCE, True),
             view(2, user(f"load_batch at {TRAIN}:12"), False, cpu_pct=99.0)]
    findings = live_findings(views, 2.0, multi_node=False)
    assert failing(findings) == [("hang.rank.user_code", "rank 2 on node7")]
    assert "load_batch at /home/me/train.py:12 (99 % CPU" in findings[0].message
    assert findings[0].action == "restart-app"


def test_a_rank_seen_entering_the_collective_in_the_window_is_not_named_stuck_outside() -> None:
    """A peer just died: rank 1 was in its own code at the start of the window and in the
    all_reduce at its end. Only a rank never seen in the waited collective is named."""
    sleep = user(f"step at {TRAIN}:36")
    arriving = view(1, sleep, False, moved=True, collectives_seen=[ALL_REDUCE.__dict__])
    views = [view(0, ALL_REDUCE, True), arriving, view(2, None, False, state="exited")]
    assert failing(live_findings(views, 2.0, multi_node=False)) == [
        ("hang.rank.dead", "rank 2 on node7")]
    arriving.collectives_seen = []
    assert failing(live_findings(views, 2.0, multi_node=False)) == [
        ("hang.rank.user_code", "rank 1 on node7"), ("hang.rank.dead", "rank 2 on node7")]


def test_a_rank_in_d_state_is_named_only_while_the_others_wait() -> None:
    d_state = view(2, user(f"save at {TRAIN}:70"), False, state="disk-sleep")
    stuck = live_findings([view(0, ALL_REDUCE, True), view(1, ALL_REDUCE, True), d_state],
                          2.0, multi_node=False)
    assert failing(stuck) == [("hang.rank.d_state", "rank 2 on node7")]
    assert stuck[0].action == "drain-node"
    moving = [view(0, user(f"step at {TRAIN}:41"), False), view(1, ALL_REDUCE, False), d_state]
    assert failing(live_findings(moving, 2.0, multi_node=False)) == []


def test_every_rank_waiting_blames_no_local_rank_and_says_where_to_look() -> None:
    views = [view(r, ALL_REDUCE, True, world_size=6) for r in range(3)]  # 3 on another node
    (alone,) = live_findings(views, 2.0, multi_node=False)
    assert (alone.check, alone.status, alone.subject) == ("hang.verdict", Status.FAIL, None)
    assert "every node" in (alone.hint or "")
    (gathered,) = live_findings(views, 2.0, multi_node=True)
    assert "gpucheck comm" in (gathered.hint or "")
    whole = [view(r, ALL_REDUCE, True) for r in range(3)]  # the whole job is on this node
    (one_node,) = live_findings(whole, 2.0, multi_node=False)
    assert "gpucheck comm" in (one_node.hint or "")


def _on_gpu(v: RankView, util: float) -> RankView:
    v.gpu = {"gpu": v.rank, "gpu_name": "NVIDIA H200", "gpu_memory_bytes": 1 << 30,
             "gpu_sm_util_pct": util}
    v.steady = v.pinned or v.steady
    return v


def test_nccl_ranks_busy_on_their_gpus_name_the_rank_whose_gpu_is_idle() -> None:
    item = Site("user", None, f"step at {TRAIN}:88", "item")
    views = [_on_gpu(view(r, item, False, steady=True), 100.0) for r in range(3)]
    views.append(_on_gpu(view(3, user(f"load_batch at {TRAIN}:12"), False), 0.0))
    findings = live_findings(views, 2.0, multi_node=False)
    assert failing(findings) == [("hang.rank.user_code", "rank 3 on node7")]
    assert "idle on its GPU (0 % SM)" in findings[0].message


def test_every_gpu_busy_in_a_long_step_names_no_one() -> None:
    item = Site("user", None, f"step at {TRAIN}:88", "item")
    views = [_on_gpu(view(r, item, False, steady=True), 100.0) for r in range(4)]
    # Nobody moved in the window: no rank is named, and it is no all-clear either.
    assert failing(live_findings(views, 2.0, multi_node=False)) == [("hang.verdict", None)]
    views[3] = _on_gpu(view(3, user(f"load_batch at {TRAIN}:12"), False), 0.0)
    views[2].gpu = None  # no GPU figures for half the ranks: no majority, no verdict
    views[1].gpu = None
    assert failing(live_findings(views, 2.0, multi_node=False)) == []


def test_ranks_split_evenly_between_two_collectives_name_no_one() -> None:
    broadcast = Site("collective", "broadcast", f"sync at {TRAIN}:50", "broadcast")
    views = [view(0, ALL_REDUCE, True), view(1, broadcast, True)]
    (finding,) = live_findings(views, 2.0, multi_node=False)
    assert (finding.check, finding.status) == ("hang.verdict", Status.WARN)


def test_stacks_unreadable_for_any_reason_judge_nothing_but_a_dead_rank() -> None:
    views = [view(r, None, False, stack_error="missing: py-spy is not installed")
             for r in range(2)]
    views.append(view(2, None, False, state="exited", pid=None))
    findings = live_findings(views, 2.0, multi_node=False)
    assert findings[0].status is Status.SKIP and "py-spy is not installed" in findings[0].message
    assert failing(findings) == [("hang.rank.dead", "rank 2 on node7")]


def test_only_allowlisted_variables_of_a_target_are_kept() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "29500",
           "HF_TOKEN": "hf_secret", "AWS_SECRET_ACCESS_KEY": "xyz"}
    rank = rank_of(42, "python3", env)
    assert rank is not None and rank.rank == 1 and set(rank.env) <= set(ALLOWED)
    assert "hf_secret" not in json.dumps(rank.env)
    assert rank_of(43, "bash", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None
    assert rank_of(44, "python", {"RANK": "5", "WORLD_SIZE": "2"}) is None


def test_an_srun_python_task_is_a_rank_with_its_nodes_task_count() -> None:
    env = {"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "16",
           "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_JOB_ID": "77",
           "SLURM_STEP_ID": "0"}
    rank = rank_of(50, "python3.11", env)
    assert rank is not None and (rank.rank, rank.local_rank, rank.local_world_size) == (9, 1, 8)
    assert rank.job == "slurm:77.0"
    del env["SLURM_STEP_TASKS_PER_NODE"]
    assert rank_of(50, "python3.11", env).local_world_size is None  # type: ignore[union-attr]


def test_missing_local_ranks_need_the_launchers_local_world_size() -> None:
    def rank(r: int, local_size: int | None) -> RankProcess:
        return RankProcess(r, r, 8, r - 4, local_size, "job", "python")
    assert missing_local_ranks([rank(4, 4), rank(5, 4), rank(7, 4)]) == [(6, 2)]
    assert missing_local_ranks([rank(4, None), rank(5, None)]) == []


def test_nvml_gives_each_ranks_gpu_memory_and_utilisation(monkeypatch) -> None:
    gpus = [FakeGpu(bus_id=f"00000000:{i + 1:02x}:00.0") for i in range(2)]
    gpus[1].pids, gpus[1].proc_util = [4242], {4242: 97}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    found, note = per_process([4242, 4243])
    assert note is None
    assert found[4242]["gpu"] == 1 and found[4242]["gpu_sm_util_pct"] == 97
    gpus[1].proc_util = {}  # no sample: NVML raises NotFound; listed there, so at 0 %
    found, _ = per_process([4242])
    assert found[4242]["gpu_sm_util_pct"] == 0.0


def test_a_gpu_nvml_fails_on_leaves_the_other_gpus_ranks_their_view(monkeypatch) -> None:
    gpus = [FakeGpu(bus_id=f"00000000:{i + 1:02x}:00.0") for i in range(2)]
    gpus[0].lost = True
    gpus[1].pids, gpus[1].proc_util = [4242], {4242: 97}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    found, note = per_process([4242])
    assert found[4242]["gpu"] == 1 and found[4242]["gpu_sm_util_pct"] == 97
    assert note is not None and note.startswith("NVML: GPU 0:")


@pytest.fixture
def fake_rank(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real process that looks like a rank (no torch: cheap), a secret in its env."""
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT="1", HF_TOKEN="hf_do_not_print")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_no_ptrace_permission_is_a_skip_naming_the_capability(fake_rank, tmp_path, monkeypatch,
                                                              capsys) -> None:
    fake = tmp_path / "py-spy"  # what py-spy prints when ptrace is refused
    fake.write_text("#!/bin/sh\necho \"Permission Denied: Try running again with elevated "
                    "permissions by going 'sudo env \\\"PATH=\\$PATH\\\" !!'\"\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "r.json"
    code = main(["hang", str(fake_rank.pid), "--window", "1", "-q", "-o", str(out)])
    report = json.loads(out.read_text())
    findings = [f for s in report["sections"] for f in s["findings"]]
    verdict = next(f for f in findings if f["check"] == "hang.verdict")
    assert code == 0 and verdict["status"] == "SKIP"
    assert "CAP_SYS_PTRACE" in verdict["message"] and "ptrace_scope" in verdict["message"]
    assert "hf_do_not_print" not in out.read_text()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--traces", "/nonexistent/fr"], "no such directory"),
    (["999999999"], "no process with PID"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys) -> None:
    assert main(["hang", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_an_empty_trace_folder_says_how_to_arm_the_job(tmp_path, capsys) -> None:
    assert main(["hang", "--traces", str(tmp_path)]) == 2
    assert "TORCH_FR_DUMP_TEMP_FILE" in capsys.readouterr().err


def test_a_process_that_is_no_rank_is_a_usage_error(capsys) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=clean_env())
    try:
        assert main(["hang", str(proc.pid)]) == 2
    finally:
        proc.kill()
        proc.wait(timeout=30)
    err = capsys.readouterr().err.strip()
    assert f"PID {proc.pid} is no rank" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_a_hang_report_renders_in_every_format(fmt: str) -> None:
    views = [view(0, ALL_REDUCE, True), view(1, user(f"load at {TRAIN}:12"), False)]
    views[0].stack = [f"all_reduce at {C10D}:4181", f"step at {TRAIN}:40"]
    report = Report("hang", [ranks_section("127.0.0.1:29500/", views, 2.0, False, [])])
    text = render(report, fmt)
    assert "rank 1" in text
    if fmt == "json":
        assert Report.from_dict(json.loads(text)).verdict() is Status.FAIL


PYSPY = Path(__file__).resolve().parent / "data" / "pyspy"


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


