"""Every finding's subject is a gpucheck.subject.Subject (issue 25): JSON carries the rank,
GPU, node or port as fields, and no renderer reads them back from the words. Text given
as a subject: mypy rejects a plain str, and a Finding refuses one typed Any when made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck import subject
from gpucheck.distributed.job import flight_findings, rank_failure_findings
from gpucheck.distributed.launch import RankFailure
from gpucheck.hang.findings import GroupVerdict, group_findings
from gpucheck.health import xids as sticky
from gpucheck.health.state import Damaged
from gpucheck.health.state import fault as checked_fault
from gpucheck.preflight.verdict import alloc_section
from gpucheck.probes.xid_section import XidFault
from gpucheck.render import render
from gpucheck.report import Finding, Report, ReportShapeError, Section, Status, fail, warn
from gpucheck.stress.gemm import power_findings
from gpucheck.stress.records import PowerReading


def test_a_plain_string_subject_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match=r"gpucheck\.subject\.Subject"):
        warn("gpu.busy", "m", "h", "rank 1")  # type: ignore[arg-type]


def _stored(findings: list[Finding]) -> list[dict]:
    report = Report("stress", [Section("s", "S", findings=findings)])
    return json.loads(render(report, "json"))["sections"][0]["findings"]


def test_a_failed_rank_is_named_by_its_rank_field() -> None:
    failure = RankFailure(rank=3, local_rank=1, exitcode=1, signal=None, message="boom")
    (stored,) = _stored(rank_failure_findings([failure], "comm"))
    assert stored["subject"] == "rank 3"
    assert stored["subject_fields"] == {"kind": "rank", "label": "rank 3", "rank": 3}


def test_ranks_named_together_keep_every_rank_as_a_field() -> None:
    diagnoses = [{"rank": r, "flight_recorder": {"skipped": "no buffer"}} for r in (4, 1)]
    (stored,) = _stored(flight_findings(diagnoses, "comm"))
    assert stored["subject"] == "rank 1, 4"
    assert (stored["subject_fields"]["kind"], stored["subject_fields"]["ranks"]) == (
        "ranks", [1, 4])
    one = flight_findings([diagnoses[0]], "comm")[0]
    assert (one.subject.kind, one.subject.rank) == (subject.Kind.RANK, 4)


def test_a_hang_trace_culprit_and_the_silent_ranks_are_fields() -> None:
    culprit = _stored(group_findings(GroupVerdict("0", "default_pg", [0, 1, 2, 3],
                                                  culprits={2: "never reached #7"})))[0]
    silent = _stored(group_findings(GroupVerdict("0", "default_pg", list(range(40)),
                                                 no_dump=list(range(30)))))[0]
    assert culprit["subject_fields"]["rank"] == 2
    assert silent["subject_fields"]["ranks"] == list(range(30))  # the words show 20
    assert silent["subject"].endswith("and 10 more")


def test_a_capped_gpu_and_a_failed_allocation_name_their_rank() -> None:
    rows = [PowerReading(r, 10, 690.0, 700.0, 500.0 if r == 1 else 700.0, 700.0, None)
            for r in range(2)]
    capped = [f for f in power_findings(rows, [], {}) if f.check == "stress.power.limit"
              and f.status is Status.WARN]
    assert [f.subject.rank for f in capped] == [1] and capped[0].subject.label == "rank 1"
    section, _ = alloc_section([{"rank": 5, "ok": False, "bytes": 1, "error": "OOM"}],
                               [{"rank": 5, "host": "h", "node_rank": 0}])
    assert _stored(section.findings)[0]["subject_fields"]["rank"] == 5


def test_the_line_and_prometheus_read_fields_never_words() -> None:
    gpu = subject.gpu(3, "GPU 3 (H200, bus 0000:48:00.0, GPU-1)", bus_id="0000:48:00.0")
    words = subject.text("GPU 7 (H200, bus 0000:99:00.0)")
    assert "GPU 3 (bus 0000:48:00.0): " in render(
        Report("health", [Section("s", "S", findings=[fail("gpu.query", "m", "h", gpu)])]),
        "line")
    rail = Report("health", [Section("s", "S", findings=[
        warn("ib.port.rate", "HDR", "reseat", subject.port("mlx5_0/1", "left rail"))])])
    assert 'subject="left rail",gpu="",hca="mlx5_0",port="1"' in render(rail, "prometheus")
    report = Report("health", [Section("s", "S", findings=[fail("gpu.query", "m", "h", words)])])
    assert "GPU 7 (H200, bus 0000:99:00.0): " in render(report, "line")
    assert 'gpu=""' in render(report, "prometheus")


def test_a_remembered_fault_keeps_its_gpu_fields(tmp_path: Path) -> None:
    gpu = subject.gpu(2, "GPU 2 (H200, bus 0000:1A:00.0)", bus_id="0000:1A:00.0")
    finding = fail("kernel_log.xid", "XID 48", "reset", gpu, cause="table.reset-gpu")
    (record,) = sticky.new_faults([XidFault("0000:1A:00.0", 48, finding)], "boot", "now")
    read = checked_fault(json.loads(json.dumps(record)), "faults[0]")
    (again,) = sticky.still_findings([read], set())
    assert again.subject == gpu and again.subject.bus_id == "0000:1A:00.0"
    with pytest.raises(Damaged):
        checked_fault(record | {"subject_fields": {"kind": "gpu", "label": 2}}, "faults[0]")
    older = {k: v for k, v in record.items() if k != "subject_fields"}
    (words,) = sticky.still_findings([checked_fault(older, "faults[0]")], set())
    assert (words.subject.kind, words.subject.label) == (subject.Kind.TEXT, gpu.label)


def test_a_report_with_a_damaged_ranks_subject_is_refused() -> None:
    made = subject.ranks([0, 5], "rank 0, rank 5")  # its round trip: tests/test_vocabulary.py
    raw = Report("x", [Section("s", "S", findings=[warn("gpu.busy", "m", "h", made)])]).to_dict()
    raw["sections"][0]["findings"][0]["subject_fields"]["ranks"] = ["zero"]
    with pytest.raises(ReportShapeError, match="'ranks' is not a list of integers"):
        Report.from_dict(raw)


def test_a_node_finding_gathered_into_the_job_keeps_its_fields_and_gains_the_node() -> None:
    gpu = subject.gpu(1, "GPU 1 (H200)", bus_id="0000:11:00.0")
    placed = gpu.on_node(2, f"node 2 (h2) {gpu}", "h2")
    assert (placed.kind, placed.gpu, placed.node, placed.host, placed.label) == (
        subject.Kind.GPU, 1, 2, "h2", "node 2 (h2) GPU 1 (H200)")
    named = subject.text("CUDA_VISIBLE_DEVICES").on_node(0, "node 0 (h0) CUDA_VISIBLE_DEVICES")
    assert (named.kind, named.node) == (subject.Kind.NODE, 0)


def test_the_short_name_comes_from_the_fields_not_the_words() -> None:
    assert subject.gpu(3, "GPU 3 (0000:17:00.0, NVIDIA H100)").short_name() == "GPU 3"
    on_node = subject.gpu(3, "node 1 (h1) GPU 3 (0000:17:00.0)").on_node(1, "node 1 (h1) GPU 3")
    assert on_node.short_name() == "node 1 GPU 3"
    assert subject.rank(2, "rank 2 (pid 7, cuda:2)").short_name() == "rank 2"
    assert subject.node(4, "node 4 (h4)").short_name() == "node 4"
    # No number names a pair or a setting: its label, whole (a "(" in it is no cut).
    assert subject.pair(0, 1, "cuda:0 -> cuda:1").short_name() == "cuda:0 -> cuda:1"
    assert subject.text("NCCL_IB_HCA (mlx5_0)").short_name() == "NCCL_IB_HCA (mlx5_0)"
