"""Section.metrics: a section's figures as data, through JSON and back (schema 3)."""

from __future__ import annotations

import json

import pytest

from gpucheck import subject
from gpucheck.measure import Better, Metric
from gpucheck.report import Report, ReportShapeError, Section


def test_section_metrics_round_trip_through_json() -> None:
    metric = Metric("stress.gemm.bf16.tflops", "TFLOP/s", Better.HIGHER, 612.5,
                    subject.rank(3, gpu=3), spread=0.02)
    report = Report("stress", [Section("gemm", "GEMM", metrics=[metric])])
    back = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert back.sections[0].metrics == [metric]
    assert back.sections[0].metrics[0].key() == "stress.gemm.bf16.tflops.rank3"


def test_no_metrics_read_as_none_and_metrics_not_a_list_are_a_shape_error() -> None:
    raw = Report("env", [Section("system", "System")]).to_dict()
    del raw["sections"][0]["metrics"]
    assert Report.from_dict(raw).sections[0].metrics == []
    raw["sections"][0]["metrics"] = {"name": "x"}
    with pytest.raises(ReportShapeError):
        Report.from_dict(raw)
