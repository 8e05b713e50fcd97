"""`gpucheck preflight`'s judgement, budget and actions on recorded figures: the
512-node elimination, SKIP or FAIL for an unfinished check, the exclude file, the
drain (scontrol replaced by a recording stand-in), the command line; XIDs since boot,
each node's all_reduce bus bandwidth (expected figure, peers, confirmed before
condemning), who speaks for a silent rank 0, and the hang guard."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.comm.internode import round_schedule
from gpucheck.comm.internode_verdicts import find_node_suspects, internode_findings, node_pair_rows
from gpucheck.comm.records import LinkRow
from gpucheck.context import Console
from gpucheck.preflight import actions
from gpucheck.preflight.verdict import confirmed_slow_nodes, decide
from gpucheck.preflight.worker import LINK_SHIFTS, Budget, kernel_log_findings
from gpucheck.report import Report, Section, ok, warn

NODES = 512
SLOW = 137


def _links(slow: int | None, nodes: int = NODES) -> list[LinkRow]:
    """One rail per node, the two ring shifts; `slow` sends and receives at 1/5."""
    links = []
    for pairs in round_schedule(nodes, LINK_SHIFTS):
        for src, dst in pairs:
            gbps = 20.0 if slow in (src, dst) else 100.0 - (src * 7 + dst) % 5
            links.append(LinkRow((dst - src) % nodes, src, dst, 0, src, dst, gbps,
                                 (gbps, gbps * 0.99, gbps * 0.98)))
    return links


def _again(links: list[LinkRow], pairs: set[tuple[int, int]],
           slow_again: bool) -> list[LinkRow]:
    return [replace(x, round="again", samples_gbps=(x.bandwidth_gbps if slow_again else 99.0,) * 3)
            for x in links if (x.src_node, x.dst_node) in pairs]


def test_two_ring_shifts_whatever_the_node_count() -> None:
    assert len(round_schedule(NODES, LINK_SHIFTS)) == 2
    assert len(round_schedule(4, LINK_SHIFTS)) == 2
    assert round_schedule(2, LINK_SHIFTS) == [[(0, 1), (1, 0)]]
    assert len(round_schedule(NODES)) == NODES - 1  # comm's full schedule is unchanged


def test_a_slow_node_among_512_is_named_alone_by_elimination() -> None:
    suspects = find_node_suspects(_node_samples(_links(SLOW)), 0.5)
    assert suspects.members == {SLOW: "both"}
    assert find_node_suspects(_node_samples(_links(None)), 0.5).empty


def _node_samples(links: list[LinkRow]) -> dict:
    from gpucheck.comm.internode_verdicts import node_pair_rows, node_samples

    return node_samples(node_pair_rows(links))


def test_the_slow_node_is_condemned_only_when_slow_again_beside_a_known_good_one() -> None:
    from gpucheck.comm.internode import exchanges_for

    # 32 nodes (the elimination among 512: the test above): three judgements of them.
    links = _links(SLOW % 32, 32)
    suspects = find_node_suspects(_node_samples(links), 0.5)
    wanted = {p for x, y in exchanges_for(suspects) for p in ((x, y), (y, x))}
    assert suspects.references  # a known-good pair is measured beside the suspect's
    rows = node_pair_rows(links)
    labels = {n: f"node {n}" for n in range(32)}

    def condemned(again: list[LinkRow] | None) -> list[int]:
        return confirmed_slow_nodes(internode_findings(rows, 0.5, labels, again))

    assert condemned(_again(links, wanted, slow_again=True)) == [SLOW % 32]
    assert condemned(_again(links, wanted, slow_again=False)) == []
    assert condemned([]) == [] and condemned(None) == []


def _result(checks: dict, strict: bool = False, stress: dict | None = None) -> dict:
    return result_of(checks, nodes=2, strict=strict, stress=stress)


def _sdc(wrong_rank: int | None) -> dict:
    records = [{"rank": r, "dtype": "bf16", "size": 64, "mode": "bitwise", "iters": 10,
                "duration_s": 1.0, "bad_iters": 0, "first_bad_iter": None,
                "worst_elements": 0, "p50_ms": 1.0, "p99_ms": 1.1,
                "digest": "bad" if r == wrong_rank else "good", "group": "H100"}
               for r in range(4)]
    return {"sdc": {"dtype": "bf16", "size": 64, "duration_s": 1.0, "tolerance": 0.02,
                    "rows_checked": 64, "records": records,
                    "reference_deviations": [0.5 if r == wrong_rank else 0.001
                                             for r in range(4)]}}


def test_a_wrong_product_is_a_no_go_naming_its_node_rank_and_gpu() -> None:
    decision = decide(_result({"sdc": {"state": "done"}}, stress=_sdc(2)))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert (node["host"], node["node_rank"], node["ranks"], node["gpus"]) == \
        ("gpu-b", 1, [2], ["cuda:0"])
    head = decision["sections"][0]
    assert [(f["check"], f["subject"], f["action"]) for f in head["findings"]] == \
        [("preflight.node", "gpu-b", "drain-node")]


def test_healthy_figures_are_a_go() -> None:
    decision = decide(_result({"sdc": {"state": "done"}}, stress=_sdc(None)))
    assert decision["go"] is True and decision["failing"] == []


def test_an_unfinished_check_is_a_skip_and_with_strict_a_fail() -> None:
    checks = {"links": {"state": "unfinished", "reason": "2 s of the 60 s budget left"}}
    lenient = decide(_result(checks))
    assert lenient["go"] is True
    budget = next(s for s in lenient["sections"] if s["name"] == "budget")
    assert [(f["status"], f["subject"]) for f in budget["findings"]] == [("SKIP", "links")]
    strict = decide(_result(checks, strict=True))
    assert strict["go"] is False and strict["failing"] == []


def test_the_budget_counts_down_from_its_start() -> None:
    now = [100.0]
    budget = Budget(60, clock=lambda: now[0])
    now[0] = 130.0
    assert budget.left_here() == 30.0
    now[0] = 200.0
    assert budget.left_here() == 0.0


def test_the_exclude_file_is_written_when_empty_and_names_only_safe_hosts(
        tmp_path: Path) -> None:
    path = tmp_path / "exclude"
    assert actions.write_exclude_file(str(path), []) == []
    assert path.read_text() == ""
    failing = [{"host": "gpu-b"}, {"host": "gpu-a"}, {"host": "bad\nhost"}, {"host": "gpu-b"}]
    assert actions.write_exclude_file(str(path), failing) == ["gpu-a", "gpu-b"]
    assert path.read_text() == "gpu-a\ngpu-b\n"


@pytest.fixture
def recording_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `scontrol` first on PATH that records its arguments, one a line."""
    record = tmp_path / "scontrol.args"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return record


NODE = {"host": "gpu-b", "node_rank": 1, "ranks": [2], "gpus": ["cuda:0"],
        "checks": ["preflight.sdc"], "why": ['deviates 0.5 "from" the reference\n']}


def test_drain_runs_scontrol_for_its_own_failing_node(recording_scontrol: Path) -> None:
    done = actions.drain_node(NODE, "cuda", under_slurm=True, drain=True)
    assert done is not None and done["ran"] and done["exit_code"] == 0
    args = recording_scontrol.read_text().splitlines()
    assert args[:4] == ["update", "NodeName=gpu-b", "State=DRAIN",
                        args[3]] and args[3].startswith("Reason=gpucheck preflight: ")
    assert '"' not in args[3] and len(args) == 4


@pytest.mark.parametrize(("device", "slurm", "drain"), [
    ("cpu", True, True), ("cuda", True, False), ("cuda", False, True)])
def test_drain_only_prints_the_command_otherwise(recording_scontrol: Path, device: str,
                                                 slurm: bool, drain: bool) -> None:
    done = actions.drain_node(NODE, device, under_slurm=slurm, drain=drain)
    assert done is not None and not done["ran"]
    assert done["command"].startswith("scontrol update NodeName=gpu-b State=DRAIN")
    assert not recording_scontrol.exists()


def test_a_command_not_on_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["preflight", "--", "no-such-command-gpucheck"]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, **faults: dict) -> None:
    import sys

    from tests.fake_pynvml import FakeGpu, FakeNvml

    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(2)]
    for key, changes in faults.items():
        for attr, value in changes.items():
            setattr(gpus[int(key[3:])], attr, value)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)


def _by_check(findings: list[dict], check: str) -> list[tuple[str, str]]:
    return [(f["status"], f["subject"][:5]) for f in findings if f["check"] == check]


def test_nvml_counts_only_other_processes_as_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.preflight.worker import nvml_findings

    _fake_nvml(monkeypatch, gpu0={"pids": [111]}, gpu1={"pids": [4242]})
    found = nvml_findings("cuda", own_pids=[111, 112], environ=os.environ)
    assert _by_check(found, "gpu.busy") == [("OK", "GPU 0"), ("WARN", "GPU 1")]


def test_nvml_fail_condemns_its_node_and_a_healthy_node_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.preflight.worker import nvml_findings

    _fake_nvml(monkeypatch, gpu1={"ecc_volatile_unc": 3, "ecc_aggregate_unc": 3})
    bad = nvml_findings("cuda", environ=os.environ)
    _fake_nvml(monkeypatch)
    good = nvml_findings("cuda", environ=os.environ)
    assert [f for f in good if f["status"] == "FAIL"] == []
    nodes = [{"node_rank": 0, "findings": good}, {"node_rank": 1, "findings": bad}]
    decision = decide(_result({"nvml": {"state": "done", "nodes": nodes}}))
    assert decision["go"] is False
    [node] = decision["failing"]
    assert node["host"] == "gpu-b" and node["checks"] == ["gpu.ecc.volatile_uncorrected"]
    assert str(node["gpus"][0]).startswith("GPU 1")


def test_an_exclude_file_that_is_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert cli.main(["preflight", "--exclude-file", str(tmp_path)]) == 2


def test_the_line_format_gives_the_failing_node_in_one_line() -> None:
    from gpucheck.commands.preflight import _report
    from gpucheck.render import render

    text = render(_report(decide(_result({"sdc": {"state": "done"}}, stress=_sdc(2))),
                          None), "line")
    assert text.count("\n") <= 1 and "preflight.node" in text and "gpu-b" in text


@pytest.mark.parametrize(("local_rank", "host", "drained"), [
    (0, "gpu-b", True), (1, "gpu-b", False), (0, "gpu-a", False)])
def test_only_the_failing_node_own_rank_0_drains_it(
        recording_scontrol: Path, monkeypatch: pytest.MonkeyPatch, local_rank: int,
        host: str, drained: bool) -> None:
    import argparse
    from types import SimpleNamespace

    from gpucheck.commands import preflight
    from gpucheck.distributed import world

    monkeypatch.setattr(world, "host_name", lambda: host)
    monkeypatch.setitem(preflight.STARTED_ENVIRONMENT, "SLURM_JOB_ID", "77")
    me = SimpleNamespace(local_rank=local_rank, node_rank=1, rank=2 + local_rank)
    preflight._drain(argparse.Namespace(drain=True), SimpleNamespace(device="cuda"),
                     {"failing": [NODE]}, me)
    assert recording_scontrol.exists() is drained


# --- what a passing gate prints before the job (issue 36 item 3) -----------------------

def _passed(problems: int) -> Report:

    findings = [ok("preflight.go", "2 rank(s) on 1 node(s) passed: the command starts on "
                   "every rank")] + [warn("gpu.busy", f"GPU {n} is busy", "look at it")
                                     for n in range(problems)]
    return Report("preflight", [Section("preflight", "Preflight: go / no-go", {"go": True},
                                        findings)] + [
        Section(f"s{n}", f"Section {n}", {f"key_{k}": k for k in range(10)}) for n in range(12)])


def test_a_passing_gate_prints_one_screen_and_writes_the_full_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import time

    from gpucheck.commands import preflight

    out = tmp_path / "pf.json"
    args = argparse.Namespace(format=None, quiet=False, outputs=[str(out)], output=None,
                              baseline=None)
    preflight._show(_passed(1), args, time.monotonic() - 38, Console.of_process())
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("gpucheck preflight on ") and shown[0].endswith(" in 38 s")
    assert any("[WARN] gpu.busy" in line for line in shown)
    assert shown[-1] == f"Full report: {out}" and len(shown) < 10
    assert len(json.loads(out.read_text())["sections"]) == 13


def test_the_gate_summary_keeps_to_one_screen_however_many_problems() -> None:
    from gpucheck.render.text import BRIEF_PROBLEM_LINES, render_brief

    lines = render_brief(_passed(40), 12.0, []).splitlines()
    assert len(lines) <= BRIEF_PROBLEM_LINES + 4
    assert lines[-2].strip().endswith("more in the full report")
    assert lines[-1] == "Full report: not kept (add -o FILE.json)"


def test_a_gate_without_a_command_does_not_say_one_starts() -> None:
    from gpucheck.preflight.verdict import verdict_section

    result = {"world_size": 2, "ranks": [{"rank": r, "node_rank": 0, "host": "vm"}
                                         for r in range(2)], "command_given": False}
    (go,) = verdict_section(result, [], True).findings
    assert "none starts" in go.message and "the command starts" not in go.message


# --- XIDs since boot (the nvml check) ---

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
