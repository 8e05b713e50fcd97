"""`gpucheck hang` on real 3-rank gloo jobs (127.0.0.1) that hang on purpose.

Two jobs, each shared by the tests of one module fixture: a healthy slow job (then one
rank stopped, then killed) and a desynchronised torchrun job that writes Flight Recorder
dumps (a rank stuck in its own code: tests/test_hang_nodes.py). Every test names the right
rank and only it; every process is killed when its fixture ends.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucheck.cli import build_parser
from gpucheck.commands import hang
from gpucheck.context import RunContext
from gpucheck.hang.findings import judge_group
from gpucheck.hang.procs import discover
from gpucheck.hang.traces import dump_files, groups, load
from gpucheck.report import Report, Status
from tests.hang_launch import Job, hang_job, wait_for


def run_hang(*argv: str) -> Report:
    # The shortest window (py-spy records whole seconds): the jobs below step in 0.3 s.
    args = build_parser().parse_args(["hang", "--window", "1", *argv])
    report = hang.run(args, RunContext())
    assert report is not None
    return report


def problems(report: Report) -> list[tuple[str, str | None]]:
    return [(f.check, f.subject and f.subject.label) for f in report.findings
            if f.status in (Status.WARN, Status.FAIL)]


@pytest.fixture(scope="module")
def slow_job() -> Iterator[Job]:
    with hang_job("slow", odd=2) as job:
        yield job


@pytest.fixture(scope="module")
def desync_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Job, Path]]:
    folder = tmp_path_factory.mktemp("fr")
    with hang_job("desync", odd=0, torchrun=True,
                  TORCH_FR_DUMP_TEMP_FILE=str(folder / "rank_")) as job:
        wait_for(job, "dumped", 3)
        yield job, folder


def test_a_healthy_job_that_is_merely_slow_is_not_called_hung(slow_job: Job) -> None:
    report = run_hang(*map(str, slow_job.pids))
    assert problems(report) == []
    verdict = next(f for f in report.findings if f.check == "hang.verdict")
    assert verdict.status is Status.OK
    assert report.exit_code() == 0


def test_a_stopped_rank_is_named_and_only_it(slow_job: Job) -> None:
    os.kill(slow_job.pids[2], signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the others finish their step and enter all_reduce
        report = run_hang(*map(str, slow_job.pids))
    finally:
        os.kill(slow_job.pids[2], signal.SIGCONT)
    assert problems(report) == [("hang.rank.stopped", "rank 2 on " + report.host)]
    assert report.exit_code() == 1


def test_a_rank_that_died_is_named_and_only_it(slow_job: Job) -> None:
    slow_job.procs[2].kill()
    slow_job.procs[2].wait(timeout=30)
    report = run_hang(*map(str, slow_job.pids))
    assert problems(report) == [("hang.rank.dead", "rank 2 on " + report.host)]
    assert "no longer exist" in str(report.sections[0].data["notes"])


def test_without_pids_every_rank_of_the_job_is_found(desync_job: tuple[Job, Path]) -> None:
    job, _ = desync_job
    found = discover()
    jobs = [ranks for ranks in found.jobs.values() if {r.pid for r in ranks} & set(job.pids)]
    assert len(jobs) == 1
    assert sorted(r.pid for r in jobs[0]) == sorted(job.pids)
    assert [r.rank for r in jobs[0]] == [0, 1, 2]


def test_a_rank_in_another_collective_is_named_live_through_torchruns_pid(
        desync_job: tuple[Job, Path]) -> None:
    job, _ = desync_job
    report = run_hang(str(job.procs[0].pid))
    assert sorted(r["pid"] for r in report.sections[0].data["ranks"]) == sorted(job.pids)
    assert problems(report) == [("hang.rank.desync", "rank 0 on " + report.host)]
    message = next(f.message for f in report.findings if f.check == "hang.rank.desync")
    assert "broadcast" in message and "all_reduce" in message
    armed = next(f for f in report.findings if f.check == "hang.traces.armed")
    assert armed.status is Status.OK


def test_flight_recorder_dumps_name_the_desynced_rank(desync_job: tuple[Job, Path]) -> None:
    _, folder = desync_job
    report = run_hang("--traces", str(folder))
    assert problems(report) == [("hang.traces.desync", "rank 0")]
    row = report.sections[0].data["groups"][0]
    assert row["first_mismatch"] == 4 and row["last_agreed"].startswith("#3 all_reduce")


def test_the_trace_culprit_does_not_depend_on_the_order_of_the_files(
        desync_job: tuple[Job, Path]) -> None:
    _, folder = desync_job
    dumps, _ = load(dump_files(str(folder)))
    verdicts = set()
    for order in itertools.permutations(sorted(dumps)):
        shuffled = {rank: dumps[rank] for rank in order}
        (group,) = groups(shuffled)
        verdict = judge_group(group, set(shuffled))
        verdicts.add((verdict.diverge_seq, tuple(sorted(verdict.culprits))))
    assert verdicts == {(4, (0,))}
