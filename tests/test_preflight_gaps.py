"""The three gaps closed after `gpucheck preflight` landed: XIDs since boot from the
kernel log, each node's all_reduce bus bandwidth judged (expected figure, peers,
confirmed before condemning), and a silent rank 0 (every other rank still refuses the
command and names what it knows)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from gpucheck.preflight.verdict import decide
from gpucheck.preflight.worker import kernel_log_findings

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


def test_an_xid_79_since_boot_fails_and_fails_the_node() -> None:
    found = kernel_log_findings([], runner=_runner({"dmesg": HEALTHY + XID79}), environ={})
    [xid] = [f for f in found if f.status.value == "FAIL"]
    assert xid.check == "kernel_log.xid" and "79" in xid.message
    decision = decide(result_of({"nvml": {"state": "done", "nodes": [
        {"node_rank": 0, "findings": [f.to_dict() for f in found]}]}}))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert node["host"] == "gpu-a" and node["checks"] == ["kernel_log.xid"]


def test_an_unreadable_kernel_log_is_a_skip_with_commands_bounded() -> None:
    seen: list[tuple[str, float]] = []
    fails = {"dmesg": subprocess.TimeoutExpired("dmesg", 1.0),
             "journalctl": subprocess.TimeoutExpired("journalctl", 1.0)}
    found = kernel_log_findings([], within_s=0.5, runner=_runner(fails, seen), environ={})
    assert [(f.check, f.status.value) for f in found] == [("kernel_log.read", "SKIP")]
    assert [name for name, _ in seen] == ["/dev/kmsg", "journalctl", "dmesg"]
    assert all(timeout <= 0.5 for _, timeout in seen)  # cut to the share of the budget


def test_cpu_ranks_read_the_xid_history_too_and_an_xid_79_is_no_go(tmp_path) -> None:
    from gpucheck.preflight.worker import nvml_findings
    from gpucheck.probes.kernel_log import KERNEL_LOG_VAR

    log = tmp_path / "kern.log"
    log.write_text(HEALTHY + XID79)
    environ = {KERNEL_LOG_VAR: str(log), "GPUCHECK_SYSFS": str(tmp_path / "no-sysfs")}
    found = nvml_findings("cpu", kernel_log_s=1.0, environ=environ)
    assert ("kernel_log.xid", "FAIL") in [(f["check"], f["status"]) for f in found]
    decision = decide(result_of({"nvml": {"state": "done", "nodes": [
        {"node_rank": 0, "findings": found}]}}, device="cpu"))
    assert decision["go"] is False and decision["failing"][0]["checks"] == ["kernel_log.xid"]
    log.write_text(HEALTHY)
    clean = nvml_findings("cpu", kernel_log_s=1.0, environ=environ)
    assert [f["status"] for f in clean if f["check"].startswith("kernel_log")] == ["OK"]


def result_of(checks: dict, device: str = "cuda", nodes: int = 1, per_node: int = 2,
              strict: bool = False, stress: dict | None = None) -> dict:
    """Rank 0's gathered result: `nodes` hosts gpu-a, gpu-b, ... of `per_node` ranks."""
    ranks = [{"rank": n * per_node + i, "node_rank": n, "host": f"gpu-{'abcdefgh'[n]}",
              "local_rank": i, "device": f"cuda:{i}", "pid": 100 + n * per_node + i}
             for n in range(nodes) for i in range(per_node)]
    return {"world_size": len(ranks), "device": device, "backend": "nccl", "budget_s": 60,
            "ranks": ranks, "checks": checks, "strict": strict, "stress": stress,
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


# --- each node's own all_reduce busbw (recorded figures: no timing here) ---

H100 = "NVIDIA H100 80GB HBM3"
SIZE = 256 << 20


def _records(busbw: dict[int, float], per_node: int = 2, model: str | None = None) -> list:
    """Per-rank records whose slowest rank gives each node `busbw` GB/s."""
    n = per_node
    return [{"rank": node * n + i, "node_rank": node, "model": model, "size_bytes": SIZE,
             "time_s": SIZE * 2 * (n - 1) / n / (gbps * 1e9) * (1.0 if i == 0 else 0.97)}
            for node, gbps in busbw.items() for i in range(n)]


def _nodes_check(first: dict[int, float], again: dict[int, float] | None,
                 per_node: int = 2, model: str | None = None, why_not: str | None = None,
                 ) -> dict:
    from gpucheck.preflight.node_busbw import node_figures, plan

    figures = node_figures(_records(first, per_node, model))
    wanted = plan(figures)
    measured = None if again is None else node_figures(_records(again, per_node, model))
    return {"figures": figures, "plan": wanted, "again": measured, "why_not": why_not}


def _decide_nodes(nodes: dict, device: str = "cuda", count: int = 4,
                  per_node: int = 2) -> dict:
    checks = {"all_reduce": {"state": "done", "row": {"size_bytes": SIZE, "wrong": 0},
                             "nodes": nodes}}
    return decide(result_of(checks, device, count, per_node))


def _node_section(decision: dict) -> dict:
    return next(s for s in decision["sections"] if s["name"] == "node_all_reduce")


def test_node_figure_is_busbw_of_the_slowest_rank() -> None:
    from gpucheck.preflight.node_busbw import node_figures

    figures = node_figures(_records({0: 100.0, 1: 50.0}))
    assert round(figures[0]["busbw_gbps"], 6) == 100.0
    assert round(figures[1]["busbw_gbps"], 6) == 50.0
    assert node_figures(_records({0: 100.0}, per_node=1)) == {}  # one rank: no figure


def test_healthy_nodes_stay_ok() -> None:
    decision = _decide_nodes(_nodes_check({0: 100.0, 1: 97.0, 2: 99.0, 3: 95.0}, None))
    assert decision["go"] is True
    assert [(f["check"], f["status"]) for f in _node_section(decision)["findings"]] == [
        ("preflight.node_all_reduce", "OK")]


def test_a_node_slow_against_the_others_and_slow_again_fails_alone() -> None:
    nodes = _nodes_check({0: 100.0, 1: 97.0, 2: 40.0, 3: 99.0},
                         {0: 99.0, 1: 98.0, 2: 41.0, 3: 100.0})
    assert nodes["plan"]["suspects"] == {2: ["peers"]}
    assert nodes["plan"]["known_good"] in (0, 1, 3)
    decision = _decide_nodes(nodes)
    assert decision["go"] is False
    [node] = decision["failing"]
    assert node["host"] == "gpu-c" and node["checks"] == ["preflight.node_all_reduce"]
    [bad] = [f for f in _node_section(decision)["findings"] if f["status"] == "FAIL"]
    assert bad["subject"] == "node 2 (gpu-c)" and bad["action"] == "drain-node"


def test_a_node_slow_once_then_fine_is_not_condemned() -> None:
    nodes = _nodes_check({0: 100.0, 1: 97.0, 2: 40.0, 3: 99.0},
                         {0: 99.0, 1: 98.0, 2: 97.0, 3: 100.0})
    decision = _decide_nodes(nodes)
    assert decision["go"] is True and decision["failing"] == []
    # Fine the second time: an OK that keeps its look, never a WARN (issue 36 item 4).
    [look] = [f for f in _node_section(decision)["findings"] if f.get("look")]
    assert (look["status"], look["look"]["state"], look["subject"]) == (
        "OK", "unstable", "node 2 (gpu-c)")


def test_not_measured_again_within_the_budget_never_condemns() -> None:
    nodes = _nodes_check({0: 100.0, 1: 97.0, 2: 40.0, 3: 99.0}, None,
                         why_not="no 1.2 s left of the budget to measure it again")
    decision = _decide_nodes(nodes)
    assert decision["failing"] == []
    [look] = _node_section(decision)["findings"]
    assert (look["status"], look["action"]) == ("WARN", "rerun")
    assert nodes["again"] is None


def test_cpu_ranks_confirmed_slow_are_a_warn_to_rerun_never_a_drain() -> None:
    nodes = _nodes_check({0: 10.0, 1: 9.7, 2: 4.0, 3: 9.9}, {0: 9.9, 1: 9.8, 2: 4.1, 3: 10.0})
    decision = _decide_nodes(nodes, device="cpu")
    assert decision["failing"] == [] and decision["go"] is True
    [look] = [f for f in _node_section(decision)["findings"] if f["status"] != "OK"]
    assert (look["status"], look["action"]) == ("WARN", "rerun")


def test_one_hgx_node_below_its_expected_floor_fails_and_above_it_passes() -> None:
    healthy = _nodes_check({0: 380.0}, None, per_node=8, model=H100)
    decision = _decide_nodes(healthy, count=1, per_node=8)
    assert decision["go"] is True and healthy["plan"]["suspects"] == {}
    # An NVLink down: the node's all_reduce falls to PCIe rates, twice.
    broken = _nodes_check({0: 45.0}, {0: 47.0}, per_node=8, model=H100)
    assert broken["plan"]["suspects"] == {0: ["expected"]}
    decision = _decide_nodes(broken, count=1, per_node=8)
    assert decision["go"] is False
    assert decision["failing"][0]["checks"] == ["preflight.node_all_reduce"]


def test_no_expected_figure_for_an_unlisted_model_or_a_small_message() -> None:
    from gpucheck.preflight.node_busbw import expected_for

    assert expected_for(H100, 8, SIZE) is not None
    assert expected_for("NVIDIA H100 PCIe", 8, SIZE) is None  # other clocks: not guessed
    assert expected_for(H100, 4, SIZE) is None
    assert expected_for(H100, 8, 4 << 20) is None
    # An unlisted model at 45 GB/s alone: no figure to judge it by, not a suspect.
    assert _nodes_check({0: 45.0}, None, per_node=8, model="NVIDIA B200")["plan"][
        "suspects"] == {}


# --- the hang guard (a store whose host is stopped cannot time out) ---


def test_hang_guard_cancelled_in_time_does_nothing() -> None:
    from gpucheck.preflight.actions import HangGuard

    ended: list[int] = []
    with HangGuard(60.0, 1, lambda: ended.append(-1), ended.append):
        pass
    assert ended == []


def test_hang_guard_fires_writes_what_it_knows_and_exits_1(tmp_path) -> None:
    import threading

    from gpucheck.preflight.actions import HangGuard, exclude_on_hang, on_hang_hosts

    roster = [{"rank": 0, "node_rank": 0, "host": "gpu-a"},
              {"rank": 1, "node_rank": 0, "host": "gpu-a"},
              {"rank": 2, "node_rank": 1, "host": "gpu-b"}]
    path = tmp_path / "exclude.txt"
    done = threading.Event()
    codes: list[int] = []

    def exit_now(code: int) -> None:
        codes.append(code)
        done.set()

    hosts = on_hang_hosts(1, True, roster)
    with HangGuard(0.01, 1, exclude_on_hang(str(path), hosts), exit_now):
        assert done.wait(60)
    assert codes == [1] and path.read_text() == "gpu-a\n"


def test_hang_guard_names_rank_zero_only_when_its_store_is_what_hangs() -> None:
    from gpucheck.preflight.actions import on_hang_hosts

    roster = [{"rank": r, "node_rank": r // 2, "host": "ab"[r // 2]} for r in range(4)]
    assert on_hang_hosts(1, True, roster) == [{"host": "a", "node_rank": 0}]
    assert on_hang_hosts(2, True, roster) == [{"host": "a", "node_rank": 0}]
    assert on_hang_hosts(3, True, roster) is None  # node 1 speaks through rank 2
    assert on_hang_hosts(1, False, roster) is None  # torchrun: the agent's store
    assert on_hang_hosts(0, True, roster) is None
