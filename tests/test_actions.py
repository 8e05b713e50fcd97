"""Actions on every WARN and FAIL: the table, the hint prefix, the schema, the renderers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucheck import subject
from gpucheck.checks import ACTIONS, Action, lookup
from gpucheck.probes.consistency import cuda_compat_findings, probe_consistency
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.kernel_log import read_kernel_log
from gpucheck.probes.nvml import Nvml
from gpucheck.probes.torch_build import TorchInfo
from gpucheck.probes.xid_section import kernel_log_section
from gpucheck.probes.xid_table import ACTIONS as XID_ACTIONS
from gpucheck.render import render
from gpucheck.report import Finding, Report, ReportShapeError, Section, Status, fail, ok, skip, warn
from tests.fake_pynvml import FakeGpu, FakeNvml

LOGS = Path(__file__).parent / "data" / "kernel_logs"
PROBLEMS = (Status.WARN, Status.FAIL)


def _fake(faults: dict[str, Any] | None = None, n: int = 2, **nvml: Any) -> FakeNvml:
    """`n` healthy fake GPUs, GPU 1 with `faults` (FakeGpu fields)."""
    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(n)]
    for field_name, value in (faults or {}).items():
        setattr(gpus[1], field_name, value)
    return FakeNvml(gpus, **nvml)


def _env_findings(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml | None,
                  timeout_s: float = 2.0, retry_s: float = 2.0) -> list[Finding]:
    """The driver and GPU findings of a fake machine (None: pynvml not installed)."""
    monkeypatch.setitem(sys.modules, "pynvml", None if fake is None else fake.module)
    result = probe_nvml(Nvml(timeout_s, retry_timeout_s=retry_s))
    return [f for s in result.sections for f in s.findings]


def _problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status in PROBLEMS]


# Fake-NVML machines, each with the WARN/FAIL it must produce and that finding's action.
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any], str, str]] = {
    "pending row remap": ({"remapped": (0, 1, 1, 0)}, {}, "gpu.remapped_rows.pending",
                          "reset-gpu"),
    "failed row remap": ({"remapped": (0, 0, 0, 1)}, {}, "gpu.remapped_rows.failed",
                         "replace-hardware"),
    "double-bit ECC": ({"ecc_volatile_unc": 2, "ecc_aggregate_unc": 2}, {},
                       "gpu.ecc.volatile_uncorrected", "drain-node"),
    "lifetime ECC": ({"ecc_aggregate_unc": 2}, {}, "gpu.ecc.aggregate_uncorrected", "none"),
    "pending page retirement": ({"retired_pending": 1}, {}, "gpu.retired_pages.pending",
                                "reset-gpu"),
    "narrow PCIe link": ({"pcie_width": (8, 16)}, {}, "gpu.pcie.width", "replace-hardware"),
    "thermal slowdown": ({"clock_reasons": 0x40}, {}, "gpu.clocks.event_reasons",
                         "drain-node"),
    "busy": ({"pids": [4242], "util": (97, 40)}, {}, "gpu.busy", "rerun"),
    "lost": ({"lost": True}, {}, "gpu.lost", "drain-node"),
    "persistence off": ({"persistence": 0}, {}, "gpu.persistence_mode", "fix-config"),
    "MIG change pending": ({"mig": [1, 0]}, {}, "gpu.mig_mode", "reset-gpu"),
    "fabric not started": ({"fabric": (1, 0)}, {}, "gpu.fabric", "fix-config"),
    "fabric in progress": ({"fabric": (2, 0)}, {}, "gpu.fabric", "rerun"),
    "driver/library mismatch": ({}, {"init_error": "NVMLError_LibRmVersionMismatch"},
                                "driver.nvml", "fix-config"),
    "driver not loaded": ({}, {"init_error": "NVMLError_DriverNotLoaded"}, "driver.nvml",
                          "fix-config"),
    "lost at init": ({}, {"init_error": "NVMLError_GpuIsLost"}, "driver.nvml", "drain-node"),
}


@pytest.mark.parametrize(("faults", "nvml", "check", "action"), SCENARIOS.values(),
                         ids=SCENARIOS.keys())
def test_each_fake_nvml_fault_gets_its_action(monkeypatch: pytest.MonkeyPatch,
                                              faults: dict[str, Any], nvml: dict[str, Any],
                                              check: str, action: str) -> None:
    problems = _problems(_env_findings(monkeypatch, _fake(faults, **nvml)))
    assert [f.action for f in problems if f.check == check] == [action]


def test_a_hanging_nvml_call_drains_the_node_and_the_unanswered_gpus_want_a_reset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The call hangs 30 s: past its budget (0.3 s) and the second one (0.6 s more).
    findings = _env_findings(monkeypatch, _fake({"hang": {"nvmlDeviceGetTemperature"}}, 3),
                             timeout_s=0.3, retry_s=0.6)
    actions = {(f.check, f.action) for f in _problems(findings)}
    assert actions == {("driver.nvml_hang", "drain-node"), ("gpu.query", "reset-gpu"),
                       ("gpu.topology", "reset-gpu")}


def test_a_missing_nvml_module_is_a_configuration_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    [finding] = _problems(_env_findings(monkeypatch, None))
    assert (finding.check, finding.status, finding.action) == ("driver.nvml", Status.WARN,
                                                               "fix-config")


def test_software_mismatches_found_with_fake_gpus_are_configuration_fixes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake(n=4).module)
    result = probe_nvml(Nvml(2.0))
    torch = TorchInfo(version="2.5.0", cuda="12.4", cuda_available=True, device_count=2)
    findings = [*probe_consistency(4, result.gpus, torch, None).findings,
                *cuda_compat_findings(result.driver, "13.0", result.gpus, ["sm_70"])]
    assert {(f.check, f.action) for f in _problems(findings)} == {
        ("consistency.gpu_count", "fix-config"), ("driver.cuda_compat", "fix-config"),
        ("gpu.arch_supported", "fix-config")}


def _all_scenario_findings(monkeypatch: pytest.MonkeyPatch) -> list[Finding]:
    findings = []
    for faults, nvml, _check, _action in SCENARIOS.values():
        findings += _env_findings(monkeypatch, _fake(faults, **nvml))
    for log in sorted(LOGS.glob("*.log")):
        findings += kernel_log_section(read_kernel_log(str(log)), []).findings
    return findings


def test_every_problem_of_every_scenario_has_a_listed_action_that_is_not_a_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    problems = _problems(_all_scenario_findings(monkeypatch))
    assert len(problems) >= len(SCENARIOS)
    for f in problems:
        assert f.action in ACTIONS, f
        assert f.cause is not None or f.status in lookup(f.check).action_by_status, f
    report = Report("env", [Section("all", "All", findings=problems)])
    rows = [line for line in render(report, "markdown").splitlines()  # not the summary's
            if line.startswith(("| WARN |", "| FAIL |")) and line.count(" | ") > 2]
    assert len(rows) == 2 * len(problems)  # the problems table and the section's table
    assert all(row.split(" | ")[1] in ACTIONS for row in rows)


def _kernel_log_findings(tmp_path: Path, lines: str) -> list[Finding]:
    log = tmp_path / "dmesg.txt"
    log.write_text(lines)
    return _problems(kernel_log_section(read_kernel_log(str(log)), []).findings)


def test_xid_94_asks_to_restart_the_application_through_its_table_cause(
        tmp_path: Path) -> None:
    [finding] = _kernel_log_findings(tmp_path, "[ 10.0] NVRM: Xid (PCI:0000:18:00): 94, "
                                     "pid=1234, name=python, Ch 00000008\n")
    assert finding.cause == "table.restart-app" and finding.action == "restart-app"
    assert finding.hint is not None and not finding.hint.startswith("action:")
    # The check's default alone would say otherwise: the table's cause is what decided.
    assert lookup(finding.check).action(finding.status) != Action.RESTART_APP


def test_every_kernel_log_problem_takes_the_action_its_table_row_names(tmp_path: Path) -> None:
    findings = _kernel_log_findings(tmp_path, "".join(
        f"[ {xid}.0] NVRM: Xid (PCI:0000:18:00): {xid}, pid=1, name=x, detail\n"
        for xid in (31, 48, 63, 64, 74, 79, 92, 94, 95, 119)))
    assert len(findings) >= 8
    assert all(f.cause == f"table.{f.action}" for f in findings)
    assert {"drain-node", "reset-gpu", "replace-hardware"} <= {f.action for f in findings}


def test_fixed_list_is_the_one_the_kernel_log_and_fault_watcher_write() -> None:
    assert ACTIONS == XID_ACTIONS == ("none", "rerun", "fix-config", "restart-app",
                                      "reset-gpu", "drain-node", "replace-hardware")


@pytest.mark.parametrize(("check", "status", "cause", "action"), [
    ("torch.probe", "FAIL", None, "rerun"),  # how it ended beats the torch.* namespace
    ("comm.all_reduce.correct", "FAIL", None, "drain-node"),
    ("comm.broadcast.busbw_baseline", "FAIL", None, "rerun"),
    ("bench.interrupted", "FAIL", None, "rerun"),
    ("stress.checkin", "FAIL", None, "fix-config"),
    ("stress.sdc.agreement", "FAIL", None, "drain-node"),
    ("stress.sdc.agreement", "FAIL", "all_alike", "fix-config"),
    ("driver.nvml", "FAIL", None, "fix-config"),
    ("driver.nvml", "FAIL", "needs_reset", "reset-gpu"),
])
def test_the_most_specific_declaration_decides(check: str, status: str, cause: str | None,
                                               action: str) -> None:
    assert Finding(check, Status(status), "m", "h", cause=cause).action == action


def test_a_template_segment_matches_exactly_one_segment() -> None:
    assert lookup("comm.all_reduce.correct").id == "comm.{op}.correct"
    for undeclared in ("comm.correct", "comm.a.b.correct"):
        with pytest.raises(KeyError):
            lookup(undeclared)


def test_an_undeclared_check_id_fails_when_its_finding_is_made() -> None:
    """No fallback: a new id must be declared in the check table first."""
    for maker in (warn, fail):
        with pytest.raises(KeyError, match=r"gpucheck/checks/node\.py or runs\.py"):
            maker("brand_new.check", "m", "h")
    with pytest.raises(KeyError, match=r"gpucheck/checks/node\.py or runs\.py"):
        ok("stress.brand_new", "m")


def test_no_action_is_given_by_hand_nor_read_from_a_hint() -> None:
    """The action follows from the check and its data only (issue 25)."""
    assert warn("gpu.busy", "m", "action: reset-gpu: x").action == "rerun"
    with pytest.raises(TypeError):
        warn("gpu.busy", "m", "h", action="none")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Finding("gpu.busy", Status.WARN, "m", action="rerun")  # type: ignore[call-arg]


def test_a_relayed_action_outside_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="'reboot'"):
        fail("fleet.node", "m", "h", relayed="reboot")


def test_a_stored_report_keeps_its_stored_actions() -> None:
    report = Report("env", [Section("gpus", "GPUs", findings=[
        warn("kernel_log.xid", "busy", "wait", cause="table.restart-app"),
        ok("gpu.numa", "fine")])])
    raw = json.loads(render(report, "json"))
    assert [f["action"] for f in raw["sections"][0]["findings"]] == ["restart-app", None]
    raw["sections"][0]["findings"][0]["action"] = "none"  # as a person edited it
    again = Report.from_dict(raw)
    assert again.findings[0].action == "none"  # kept, though the table says rerun
    assert Report.from_dict(again.to_dict()).to_dict() == again.to_dict()


def test_a_stored_finding_with_a_bad_action_is_refused() -> None:
    raw = Report("env", [Section("s", "S", findings=[fail("gpu.lost", "m", "h")])]).to_dict()
    raw["sections"][0]["findings"][0]["action"] = "panic"
    with pytest.raises(ValueError, match="unknown action 'panic'"):
        Report.from_dict(raw)


@pytest.mark.parametrize("status", PROBLEMS)
@pytest.mark.parametrize("action", ACTIONS)
def test_every_status_and_action_renders_in_json_markdown_and_text(status: Status,
                                                                   action: str) -> None:
    maker = warn if status is Status.WARN else fail
    finding = maker("kernel_log.xid", "seen", "do this", subject.gpu(3), cause=f"table.{action}")
    report = Report("env", [Section("s", "S", findings=[finding])], host="node7")
    assert json.loads(render(report, "json"))["sections"][0]["findings"][0]["action"] == action
    text = render(report, "text")
    assert f"[{status.value}] kernel_log.xid (GPU 3): seen\n         HINT ({action}): do " \
        "this\n" in text
    markdown = render(report, "markdown")
    row = f"| {status.value} | {action} | kernel_log.xid | GPU 3 | seen | do this |"
    assert markdown.count(row) == 2  # the problems table and the section's own


@pytest.mark.parametrize("maker", [ok, skip])
def test_ok_and_skip_render_without_an_action(maker: Any) -> None:
    report = Report("env", [Section("s", "S", findings=[maker("gpu.busy", "fine")])])
    assert json.loads(render(report, "json"))["sections"][0]["findings"][0]["action"] is None
    assert "HINT" not in render(report, "text") and "ACTION" not in render(report, "text")
    markdown = render(report, "markdown")
    assert "| status | check | subject | message | hint |" in markdown  # no action column
    assert "No FAIL or WARN findings." in markdown


def test_a_problem_without_a_hint_still_shows_its_action_in_text() -> None:
    finding = Finding("gpu.lost", Status.FAIL, "seen", None)
    text = render(Report("env", [Section("s", "S", findings=[finding])]), "text")
    assert "ACTION: drain-node" in text


@pytest.mark.parametrize("status", PROBLEMS)
def test_a_stored_problem_without_an_action_is_a_damaged_report(status: Status) -> None:
    """Schema 3 stores every WARN's and FAIL's action; none is resolved again on reading
    (the schema-1 fallback went with issue 25)."""
    maker = warn if status is Status.WARN else fail
    raw = Report("env", [Section("s", "S", findings=[maker("gpu.busy", "m", "h")])]).to_dict()
    raw["sections"][0]["findings"][0]["action"] = None
    with pytest.raises(ReportShapeError, match="without an action"):
        Report.from_dict(raw)
