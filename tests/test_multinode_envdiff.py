"""The node comparison of `gpucheck env` under a multi-node launcher, without processes."""

from __future__ import annotations

from typing import Any

from gpucheck.distributed.nodes import NodeId, diff_findings, merge_node_reports, node_facts
from gpucheck.report import Status


def _env_report(nccl: str, gpus: int, env: dict[str, str], model: str = "H100") -> dict[str, Any]:
    return {"verdict": "OK", "summary": {"OK": 1}, "sections": [
        {"name": "torch", "title": "PyTorch build", "findings": [],
         "data": {"version": "2.5.0", "nccl_version": nccl, "cuda_device_count": gpus}},
        {"name": "driver", "title": "NVIDIA driver", "findings": [],
         "data": {"driver_version": "550.54"}},
        {"name": "gpus", "title": "GPUs", "data": {"gpus": [{"name": model}] * gpus},
         "findings": [{"check": "gpu.ecc.volatile_uncorrected", "status": "OK", "message": "fine",
                       "hint": None, "subject": "GPU 0"}]},
        {"name": "environment", "title": "Env", "findings": [], "data": {"variables": env}},
    ]}


NODES = [NodeId(0, "a"), NodeId(1, "b"), NodeId(2, "c")]


def test_the_odd_node_is_named_for_each_difference() -> None:
    reports = {NODES[0]: _env_report("2.21", 8, {"NCCL_IB_HCA": "mlx5", "RANK": "0"}),
               NODES[1]: _env_report("2.21", 8, {"NCCL_IB_HCA": "mlx5", "RANK": "8"}),
               NODES[2]: _env_report("2.18", 7, {"RANK": "16"}, model="A100")}
    findings = diff_findings({n: node_facts(r) for n, r in reports.items()})
    assert all(f.status is Status.WARN and f.subject.label == "node 2 (c)" for f in findings)
    text = " ".join(f.message for f in findings)
    for expected in ("NCCL version", "GPU count", "GPU model", "NCCL_IB_HCA"):
        assert expected in text
    assert "RANK" not in text.replace("NCCL_IB_HCA", "")


def test_matching_nodes_give_one_ok_and_keep_each_nodes_verdicts() -> None:
    reports = {n: _env_report("2.21", 8, {"SLURM_NODEID": str(n.node_rank)}) for n in NODES[:2]}
    merged = merge_node_reports(reports)
    assert [f.status for f in merged.sections[0].findings] == [Status.OK]
    gpu_findings = [f for f in merged.findings if f.check == "gpu.ecc.volatile_uncorrected"]
    assert [f.subject.label for f in gpu_findings] == ["node 0 (a) GPU 0", "node 1 (b) GPU 0"]


def test_a_finding_keeps_the_action_its_probe_set_when_nodes_are_merged() -> None:
    report = _env_report("2.21", 8, {})
    # The action a probe sets is its cause (here the XID table's row), never words: the
    # merge keeps the cause, so the action stays the one the node's own report gave.
    report["sections"][2]["findings"] = [{
        "check": "kernel_log.xid", "status": "FAIL",
        "message": "XID 48 on GPU 0: double-bit ECC", "hint": None, "subject": "GPU 0",
        "cause": "table.replace-hardware", "action": "replace-hardware"}]
    merged = merge_node_reports({NODES[0]: report, NODES[1]: _env_report("2.21", 8, {})})
    failed = [f for f in merged.findings if f.status is Status.FAIL]
    assert [(f.subject.label, f.action) for f in failed] == [
        ("node 0 (a) GPU 0", "replace-hardware")]
