"""`gpucheck hang` on a node shared with other jobs and other users: each job judged on
its own, PIDs that are no rank of any job refused, and made-up environments (planted in
processes these tests start) that can neither crash nor stretch the run.

The processes here are cheap stand-ins (no torch): `sleep` or a small Python loop with
a rank's variables. Every one is killed when its test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpucheck.cli import main
from gpucheck.hang import observe
from gpucheck.hang.findings import live_findings
from gpucheck.hang.live import live_sections
from gpucheck.hang.procs import MAX_LOCAL_WORLD_SIZE, RankProcess, discover
from gpucheck.report import Status
from tests.comm_workers import clean_env, free_port

# A rank that moves between two lines of its own code (py-spy sees it progress).
MOVING = """\
import time
def load():
    time.sleep(0.01)
def step():
    time.sleep(0.01)
while True:
    load()
    step()
"""


def _rank_env(rank: int, size: int, port: int, **extra: str) -> dict[str, str]:
    return clean_env(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                     LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), **extra)


@contextlib.contextmanager
def processes(specs: list[tuple[list[str], dict[str, str]]]) -> Iterator[list[int]]:
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
             for args, env in specs]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture
def moving_script(tmp_path: Path) -> str:
    path = tmp_path / "train_moving.py"
    path.write_text(MOVING)
    return str(path)


def _wait_started(pids: list[int]) -> None:
    """Until each interpreter has replaced its environment-less start (py-spy needs
    the interpreter up): its command line names the script."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            if all(len(psutil.Process(p).cmdline()) > 1 for p in pids):
                time.sleep(1.0)
                return
        time.sleep(0.1)


def _report(tmp_path: Path, *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = tmp_path / "hang.json"
    code = main(["hang", *argv, "--window", "1", "-q", "-o", str(out)])
    return code, json.loads(out.read_text())


def test_two_jobs_are_judged_apart_and_counted(tmp_path: Path, moving_script: str) -> None:
    port_a, port_b = free_port(), free_port()
    specs = [([sys.executable, moving_script], _rank_env(r, 2, port)) for port in
             (port_a, port_b) for r in range(2)]
    with processes(specs) as pids:
        _wait_started(pids)
        os.kill(pids[1], signal.SIGSTOP)  # job A's rank 1 stopped; job B is healthy
        try:
            code, report = _report(tmp_path, *map(str, pids))
        finally:
            os.kill(pids[1], signal.SIGCONT)
    assert code == 1
    ranks = [s for s in report["sections"] if "ranks" in s["data"]]
    by_port = {s["data"]["job"].split("/")[0].rsplit(":", 1)[1]: s for s in ranks}
    assert set(by_port) == {str(port_a), str(port_b)}
    job_a = by_port[str(port_a)]
    bad = [(f["check"], f["subject"].split(" of job ")[0]) for f in job_a["findings"]
           if f["status"] in ("WARN", "FAIL")]
    assert bad == [("hang.rank.stopped", "rank 1")]
    assert job_a["data"]["job"] in next(f["subject"] for f in job_a["findings"]
                                        if f["check"] == "hang.rank.stopped")
    job_b = by_port[str(port_b)]
    assert [f["status"] for f in job_b["findings"] if f["check"] == "hang.verdict"] == ["OK"]
    jobs = next(s for s in report["sections"] if "jobs" in s["data"])
    assert [f["check"] for f in jobs["findings"]] == ["hang.jobs"]
    assert len(jobs["data"]["jobs"]) == 2
    assert {r["verdict"] for r in jobs["data"]["jobs"]} == {"FAIL", "OK"}


def test_one_job_has_no_jobs_table_and_no_job_in_its_subjects() -> None:
    views = [observe.RankView(r, r, 2, None, "node7", state="exited") for r in range(2)]
    (section,) = live_sections({0: {"jobs": {"j": [v.to_dict() for v in views]}}}, 2.0)
    assert section.data["jobs_seen"] == 1
    assert {f.subject.label for f in section.findings if f.status is Status.FAIL} == {
        "rank 0 on node7", "rank 1 on node7"}


@pytest.mark.parametrize("pid", ["shell", "init"])
def test_a_pid_above_every_job_is_a_usage_error(pid: str, capsys) -> None:
    """Before, gpucheck's own parent was skipped (an empty SKIP, exit 0) and PID 1
    stood for every rank of every user on the node."""
    target = os.getppid() if pid == "shell" else 1
    assert main(["hang", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"PID {target} is no rank" in err and len(err.splitlines()) == 1


def test_a_pid_above_ranks_of_two_jobs_is_a_usage_error(tmp_path: Path, capsys) -> None:
    ports = (free_port(), free_port())
    launcher = tmp_path / "two_jobs.py"
    launcher.write_text(  # it reaps its two ranks and ends when they are killed
        "import os, subprocess\n"
        "procs = [subprocess.Popen(['sleep', '60'], env=dict(\n"
        "    os.environ, RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',\n"
        "    MASTER_PORT=str(port))) for port in " + repr(ports) + "]\n"
        "for p in procs:\n"
        "    p.wait()\n")
    with processes([([sys.executable, str(launcher)], clean_env())]) as (pid,):
        deadline = time.monotonic() + 60
        while len(psutil.Process(pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        children = psutil.Process(pid).children()
        try:
            assert main(["hang", str(pid)]) == 2
        finally:
            for child in children:
                with contextlib.suppress(psutil.Error):
                    child.kill()
    err = capsys.readouterr().err.strip()
    assert f"PID {pid} is no rank" in err and len(err.splitlines()) == 1


HOSTILE = [
    {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": str(10**12)},
    {"RANK": "0", "WORLD_SIZE": str(10**12), "LOCAL_WORLD_SIZE": "100000"},
    {"RANK": str(10**40), "WORLD_SIZE": str(10**41)},
    {"RANK": "0", "WORLD_SIZE": "200000", "LOCAL_WORLD_SIZE": "100000"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_NODEID": "0",
     "SLURM_STEP_TASKS_PER_NODE": "1(x99999999999999999999)"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_NODEID": "9" * 30,
     "SLURM_STEP_TASKS_PER_NODE": "99999999(x2)"},
]


def test_made_up_ranks_of_another_job_leave_the_run_whole(tmp_path: Path) -> None:
    """Stand-ins with those environments, found by a search of the whole node: no
    crash, none of them sized anything, and `hang` on them ends with a report."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(subprocess.check_output(["which", "sleep"], text=True)
                                     .strip())  # comm "python3": an srun Python task
    port = free_port()
    specs = [([str(bin_dir / "python3"), "60"],
              clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env))
             for env in HOSTILE]
    with processes(specs) as pids:
        time.sleep(0.5)
        found = discover()
        mine = [r for ranks in found.jobs.values() for r in ranks if r.pid in pids]
        code, report = _report(tmp_path, *sorted({str(r.pid) for r in mine}))
    assert all(r.local_world_size is None or r.local_world_size <= MAX_LOCAL_WORLD_SIZE
               for r in mine)
    assert code in (0, 1)
    rows = [row for s in report["sections"] for row in s["data"].get("ranks", [])]
    assert len(rows) <= len(pids) + MAX_LOCAL_WORLD_SIZE


def test_no_more_than_max_py_spy_run_at_once(monkeypatch) -> None:
    """200 ranks started 89 py-spy processes at once before; now MAX_PY_SPY at most,
    and a rank whose turn does not come in time is marked, not watched."""
    running, peak, lock = [0], [0], threading.Lock()

    def fake_record(pid: int, duration_s: float) -> observe.Samples:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return observe.Samples()

    monkeypatch.setattr(observe, "record", fake_record)
    monkeypatch.setattr(observe, "_gpu_after", lambda *a: ({}, None))
    ranks = [RankProcess(os.getpid(), r, 200, r, None, "fake", "python") for r in range(200)]
    views, _ = observe.watch(ranks, "node7", window_s=0.0)
    assert len(views) == 200 and 1 <= peak[0] <= observe.MAX_PY_SPY


def test_ranks_left_unwatched_give_no_verdict_and_blame_no_one(monkeypatch) -> None:
    monkeypatch.setattr(observe, "START_BUDGET_S", 0.0)
    monkeypatch.setattr(observe, "_gpu_after", lambda *a: ({}, None))
    ranks = [RankProcess(os.getpid(), r, 3, r, None, "fake", "python") for r in range(3)]
    views, _ = observe.watch(ranks, "node7", window_s=1.0)
    assert [v.watched for v in views] == [False] * 3
    (verdict,) = live_findings(views, 1.0, multi_node=False)
    assert (verdict.check, verdict.status) == ("hang.verdict", Status.SKIP)
    sections = live_sections({0: {"jobs": {"a": [v.to_dict() for v in views],
                                           "b": [v.to_dict() for v in views]}}}, 1.0)
    (jobs,) = sections  # neither job was watched: rows in the jobs table, no section
    assert [r["verdict"] for r in jobs.data["jobs"]] == ["not watched"] * 2
    # nothing judged is no all-clear (it read OK, exit 0, before)
    assert [(f.check, f.status) for f in jobs.findings] == [("hang.jobs", Status.SKIP)]


def test_a_rank_that_exited_unreaped_is_gone_not_a_usage_error() -> None:
    """A zombie's environment is empty: it must read as a rank that went, not as a
    process that never was one."""
    proc = subprocess.Popen(["sleep", "0"], env=_rank_env(0, 2, free_port()))
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        found = discover([proc.pid])
    finally:
        proc.wait(timeout=30)
    assert (found.gone, found.not_ranks) == ([proc.pid], [])


def test_an_environment_read_that_never_answers_is_left_behind(tmp_path: Path,
                                                              monkeypatch) -> None:
    """A process stuck in the kernel with its memory map locked blocks a read of its
    /proc/PID/environ (a FIFO with no writer blocks the same way here)."""
    from gpucheck.hang import procs

    fifo = tmp_path / "environ"
    os.mkfifo(fifo)
    monkeypatch.setattr(procs, "ENVIRON_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(procs.EnvironBlocked):
            procs._read_in_time(str(fifo))
    finally:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the reader go


def test_environments_that_never_answer_share_one_wait(tmp_path: Path, monkeypatch) -> None:
    """Every rank of a job stuck in a hung driver blocks its environment: each waited
    the full timeout before (eight ranks, 8 s); now they share ENVIRON_BUDGET_S and
    the rest get the floor."""
    import builtins

    from gpucheck.hang import procs

    fifo = tmp_path / "environ"
    os.mkfifo(fifo)

    def stuck_open(path, *args, **kwargs):  # every environment blocks, as in the driver
        return builtins.open(fifo if str(path).endswith("/environ") else path, *args,
                             **kwargs)

    waits: list[float] = []
    timeout = procs.Waits.timeout
    monkeypatch.setattr(procs, "open", stuck_open, raising=False)
    monkeypatch.setattr(procs, "ENVIRON_TIMEOUT_S", 0.2)
    monkeypatch.setattr(procs, "ENVIRON_BUDGET_S", 0.3)
    monkeypatch.setattr(procs, "ENVIRON_FLOOR_S", 0.01)
    monkeypatch.setattr(procs.Waits, "timeout", lambda self: waits.append(timeout(self))
                        or waits[-1])
    try:
        with processes([(["sleep", "60"], _rank_env(r, 3, free_port())) for r in range(3)]
                       ) as pids:
            found = discover(pids)
    finally:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the readers go
    assert found.blocked == list(pids) and waits == [0.2, 0.2, 0.01]


def test_a_blocked_process_is_a_note_not_a_hang(tmp_path: Path, monkeypatch) -> None:
    from gpucheck.hang import procs

    def blocked(path: str) -> bytes:
        raise procs.EnvironBlocked(path)

    monkeypatch.setattr(procs, "_read_in_time", blocked)
    with processes([(["sleep", "60"], _rank_env(0, 1, free_port()))]) as (pid,):
        found = discover([pid])
        code, report = _report(tmp_path, str(pid))
    assert found.blocked == [pid] and found.not_ranks == []
    assert code == 0 and any(str(pid) in n for s in report["sections"]
                             for n in s["data"].get("notes", []))


def test_a_crowd_claiming_huge_local_worlds_makes_up_no_more_ranks_than_the_node_holds(
        monkeypatch) -> None:
    """300 processes of another user, each RANK=0 WORLD_SIZE=1048576 LOCAL_WORLD_SIZE=
    1024 (each its own job: one rank claimed twice): 81,840 dead ranks before. The
    user's own job, watched first, still has its missing rank called dead."""
    from gpucheck.hang import live, procs

    crowd = {f"launcher pid 1 process {pid} (other)": [
        RankProcess(pid, 0, 1 << 20, 0, 1024, "launcher pid 1", "python", user="other")]
        for pid in range(10_000, 10_300)}
    own = {"127.0.0.1:1/ (me)": [RankProcess(9_000 + r, r, 3, r, 3, "127.0.0.1:1/", "python",
                                             user="me") for r in (0, 1)]}
    monkeypatch.setattr(live, "discover", lambda pids: procs.Discovery(jobs={**crowd, **own}))
    monkeypatch.setattr(live, "_me", lambda: "me")
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr(live, "watch", lambda ranks, host, *a: (
        [observe.RankView(r.rank, r.local_rank, r.world_size, r.pid, host, watched=False)
         for r in ranks], None))
    view = live.node_view(None, 1.0, "node7", 0, 3.0)
    assert sum(len(v) for v in view["jobs"].values()) == 300 + 2 + 1
    assert [v["rank"] for v in view["jobs"]["127.0.0.1:1/ (me)"]] == [0, 1, 2]
    assert any("more ranks than this machine can hold" in n for n in view["notes"])


def test_a_job_that_ended_is_not_hung_and_the_stuck_job_comes_first() -> None:
    """Both ranks of job "a" exited during the window (destroy_process_group, then the
    end of the script): no hang.rank.dead. Job "b" has a stopped rank: its section and
    its problem lead."""
    ended = [observe.RankView(r, r, 2, 500 + r, "node7", state="exited",
                              stack_error="gone: the process exited") for r in range(2)]
    stuck = [observe.RankView(0, 0, 2, 600, "node7", state="stopped", state_start="stopped",
                              stack_error="gone"),
             observe.RankView(1, 1, 2, 601, "node7", state="sleeping", pinned=True,
                              steady=True, samples=5, site={"kind": "collective",
                              "op": "all_reduce", "where": "step at train.py:10",
                                                    "innermost": "wait at c10d.py:1"})]
    sections = live_sections({0: {"jobs": {"a": [v.to_dict() for v in ended],
                                           "b": [v.to_dict() for v in stuck]}}}, 1.0)
    assert [s.data.get("job") for s in sections] == ["b", "a", None]  # the jobs table last
    a_checks = {(f.check, f.status) for f in sections[1].findings}
    assert ("hang.verdict", Status.OK) in a_checks
    assert not any(f.check == "hang.rank.dead" for s in sections for f in s.findings)
    assert sections[0].verdict() is Status.FAIL
