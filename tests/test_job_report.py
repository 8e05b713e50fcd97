"""comm and stress run their job through `gpucheck.commands.launch`: the result,
a failure carrying rank 0's results, a launcher failure, and the other ranks' None."""

from __future__ import annotations

from typing import Any

import pytest

from gpucheck.commands import launch
from gpucheck.commands.launch import LaunchPlan
from gpucheck.context import RunContext
from gpucheck.distributed import job
from gpucheck.distributed.job import JobFailed
from gpucheck.distributed.launch import RankFailure, WorkersFailed
from gpucheck.report import Report, Section

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


def test_a_failed_job_keeps_rank_zeros_results_and_names_the_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_with(monkeypatch, JobFailed([CRASH], {"tflops": 1.0}, [], None,
                                             reporter=True))
    assert report is not None and [s.name for s in report.sections] == ["gemm", "failure"]
    assert report.sections[1].findings[0].subject.label == "rank 1"


def test_a_launcher_failure_is_a_report_naming_the_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_with(monkeypatch, WorkersFailed([CRASH]))
    assert report is not None and [s.name for s in report.sections] == ["failure"]
    assert report.sections[0].data["results_above"] == "none"
