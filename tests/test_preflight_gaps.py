"""The three gaps closed after `gpucheck preflight` landed: XIDs since boot from the
kernel log, each node's all_reduce bus bandwidth judged (expected figure, peers,
confirmed before condemning), and a silent rank 0 (every other rank still refuses the
command and names what it knows)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from gpucheck.preflight.checks import kernel_log_findings
from gpucheck.preflight.verdict import decide

XID79 = "[ 912.5] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
HEALTHY = "[    0.0] Linux version 6.8.0\n[    3.1] nvidia: loading out-of-tree module\n"


def _runner(answers: dict[str, object], seen: list[tuple[str, float]] | None = None):
    def run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        if seen is not None:
            seen.append((argv[0], timeout_s))
        answer = answers.get(argv[0], FileNotFoundError(argv[0]))
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(list(argv), 0, str(answer), "")
    return run


def test_kernel_log_without_xids_is_ok() -> None:
    found = kernel_log_findings([], runner=_runner({"dmesg": HEALTHY}))
    assert [(f.check, f.status.value) for f in found] == [("kernel_log.xid", "OK")]


def test_an_xid_79_since_boot_fails_and_fails_the_node() -> None:
    found = kernel_log_findings([], runner=_runner({"dmesg": HEALTHY + XID79}))
    [xid] = [f for f in found if f.status.value == "FAIL"]
    assert xid.check == "kernel_log.xid" and "79" in xid.message
    decision = decide(_result({"nvml": {"state": "done", "nodes": [
        {"node_rank": 0, "findings": [f.to_dict() for f in found]}]}}))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert node["host"] == "gpu-a" and node["checks"] == ["kernel_log.xid"]


def test_an_unreadable_kernel_log_is_a_skip_with_commands_bounded() -> None:
    seen: list[tuple[str, float]] = []
    fails = {"dmesg": subprocess.TimeoutExpired("dmesg", 1.0),
             "journalctl": subprocess.TimeoutExpired("journalctl", 1.0)}
    found = kernel_log_findings([], within_s=0.5, runner=_runner(fails, seen))
    assert [(f.check, f.status.value) for f in found] == [("kernel_log.read", "SKIP")]
    assert [name for name, _ in seen] == ["dmesg", "journalctl"]
    assert all(timeout <= 0.5 for _, timeout in seen)  # cut to the share of the budget


def _result(checks: dict, device: str = "cuda", nodes: int = 1, per_node: int = 2) -> dict:
    hosts = "abcdefgh"
    ranks = [{"rank": n * per_node + i, "node_rank": n, "host": f"gpu-{hosts[n]}",
              "local_rank": i, "device": f"cuda:{i}", "pid": 100 + n * per_node + i}
             for n in range(nodes) for i in range(per_node)]
    return {"world_size": len(ranks), "device": device, "backend": "nccl", "budget_s": 60,
            "ranks": ranks, "checks": checks, "strict": False,
            "fractions": {"peer": 0.9, "expected": 0.8, "link": 0.5}}


ROSTER = [{"rank": r, "node_rank": r // 2} for r in range(4)]  # 2 nodes, 2 ranks each


def test_rank_zero_answering_is_the_only_one_to_speak() -> None:
    from gpucheck.preflight.actions import speaks_for_failed_job

    assert speaks_for_failed_job([3], ROSTER, 0, reporter=True)
    assert [r for r in range(1, 4) if speaks_for_failed_job([3], ROSTER, r, False)] == []


def test_rank_zero_silent_each_node_s_lowest_live_rank_speaks() -> None:
    from gpucheck.preflight.actions import speaks_for_failed_job

    assert [r for r in range(1, 4) if speaks_for_failed_job([0], ROSTER, r, False)] == [1, 2]
    assert [r for r in range(1, 4) if speaks_for_failed_job([0, 1], ROSTER, r, False)] == [2]
    assert not speaks_for_failed_job([0], [], 1, False)  # no roster: nothing known
