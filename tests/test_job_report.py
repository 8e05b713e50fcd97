"""bench, comm and stress run their job through `gpucheck.commands.launch`: the result,
a launcher failure, the other ranks' None; a failed job as a report, without processes
(`gpucheck.distributed.job.failed_job_report`): the culprit named, what was measured
before kept, one line elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

from gpucheck.commands import launch
from gpucheck.commands.launch import LaunchPlan
from gpucheck.context import RunContext
from gpucheck.distributed import job
from gpucheck.distributed.job import JobFailed, failed_job_report
from gpucheck.distributed.launch import RankFailure, WorkersFailed
from gpucheck.report import Report, Section, Status, ok

CRASH = RankFailure(rank=1, local_rank=1, exitcode=1, signal=None,
                    message="RuntimeError: simulated device fault")


def build(result: dict[str, Any]) -> Report:
    return Report(command="stress", sections=[Section("gemm", "GEMM", dict(result))])


def run_with(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> Report | None:
    def fake_run_job(worker: Any, spec: Any, nproc: int, port: int | None,
                     ctx: RunContext) -> Any:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(job, "run_job", fake_run_job)
    plan = LaunchPlan(nproc=2, device="cpu", backend="gloo", master_port=None, timeout_s=30)
    return launch.run_reported("stress", print, None, plan, build, quiet_stdout=False,
                                   ctx=RunContext())


def test_the_result_becomes_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_with(monkeypatch, {"tflops": 1.0})
    assert report is not None and [s.name for s in report.sections] == ["gemm"]


def test_the_ranks_that_do_not_report_get_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_with(monkeypatch, None) is None


def test_a_launcher_failure_is_a_report_naming_the_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def failed(*args: Any) -> Any:
        raise WorkersFailed([CRASH])

    monkeypatch.setattr(job, "launch_local", failed)  # run_job makes it a JobFailed
    plan = LaunchPlan(nproc=2, device="cpu", backend="gloo", master_port=None, timeout_s=30)
    report = launch.run_reported("stress", print, None, plan, build, quiet_stdout=False,
                                 ctx=RunContext())
    assert report is not None and [s.name for s in report.sections] == ["failure"]
    assert report.sections[0].data["results_above"] == "none"


def measured(partial: dict[str, Any]) -> Report:
    report = Report(command="stress")
    report.add(Section("gemm", "GEMM", dict(partial), [ok("stress.gemm.peers", "fine")]))
    return report


def test_the_reporter_keeps_what_was_measured_and_names_the_failed_rank() -> None:
    exc = JobFailed([CRASH], {"tflops": 1.0}, [], None, reporter=True)
    report = failed_job_report("stress", exc, measured, quiet_stdout=False)
    assert [s.name for s in report.sections] == ["gemm", "failure"]
    failure = report.sections[-1]
    assert failure.data["results_above"] == "partial: measured before the failure"
    assert [(f.check, f.status, f.subject.label) for f in failure.findings] == [
        ("stress.rank_failed", Status.FAIL, "rank 1")]
    assert "simulated device fault" in failure.findings[0].message


def test_without_results_the_failure_is_the_whole_report(
        capsys: pytest.CaptureFixture[str]) -> None:
    exc = JobFailed([CRASH], None, [], None, reporter=True)
    report = failed_job_report("comm", exc, measured, quiet_stdout=True)
    assert report.command == "comm" and [s.name for s in report.sections] == ["failure"]
    assert report.sections[0].data["results_above"] == "none"
    assert capsys.readouterr().err.startswith("gpucheck comm: FAIL: rank 1")


def test_a_rank_that_does_not_report_says_one_line_and_exits_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    exc = JobFailed([CRASH], None, [], None, reporter=False)
    with pytest.raises(SystemExit) as stop:
        failed_job_report("comm", exc, measured, quiet_stdout=False)
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpucheck comm: rank 1")
