"""Xid lines since the last check: raised once, not again after the GPU was reset;
log rotation, a wrapped ring buffer and a reboot never hide a new line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucheck.health.state import STATE_FILE
from gpucheck.report import Status
from tests.health_fakes import BUS, DBE, PUSH, reboot, run_health, state_node, xid_line

LOST = xid_line(900.0, BUS, 79, "GPU has fallen off the bus.")
APP = xid_line(50.0, BUS, 13, "Graphics Exception: ESR 0x504648=0x80000000")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return state_node(tmp_path, monkeypatch)


def _xids(report) -> list[tuple[str, str | None]]:
    return [(f.status.value, f.subject and f.subject.label)
            for f in report.section("kernel_log").findings
            if f.status in (Status.WARN, Status.FAIL)]



def test_a_clean_log_is_ok(node):
    report = run_health(node, [APP])
    assert _xids(report) == [] and report.verdict() is Status.OK


def test_a_new_xid_line_is_raised_once_naming_the_gpu_then_not_again(node):
    first = run_health(node, [APP, PUSH])
    assert [s for s, _ in _xids(first)] == ["WARN"]
    assert _xids(first)[0][1].startswith("GPU 0 (NVIDIA H200, bus 00000000:18:00.0")
    second = run_health(node, [APP, PUSH])
    assert _xids(second) == [] and second.verdict() is Status.OK
    ok = next(f for f in second.section("kernel_log").findings if f.check == "kernel_log.xid")
    assert ok.message.startswith("no new Xid since the last check (2 earlier line(s)")


def test_a_line_after_the_last_reported_one_is_raised(node):
    run_health(node, [PUSH])
    report = run_health(node, [PUSH, LOST])
    (finding,) = [f for f in report.section("kernel_log").findings if f.status is Status.FAIL]
    assert "XID 79" in finding.message and finding.action == "drain-node"


def test_without_a_state_dir_every_xid_of_the_boot_is_raised_every_time(node):
    for _ in range(2):
        assert [s for s, _ in _xids(run_health(node, [DBE], state=False))] == ["FAIL"]


def test_a_rotated_log_without_the_remembered_line_raises_only_what_it_holds(node):
    run_health(node, [APP, PUSH])
    assert [s for s, _ in _xids(run_health(node, [DBE]))] == ["FAIL"]  # PUSH rotated away
    third = run_health(node, [DBE])
    assert third.section("kernel_log").data["xid_lines_new"] == 0


def test_a_reboot_makes_every_line_of_the_new_boot_new(node):
    run_health(node, [DBE])
    reboot(node, "boot-2")
    assert [s for s, _ in _xids(run_health(node, [DBE]))] == ["FAIL"]


def test_the_state_file_is_written_atomically_and_a_corrupt_one_fails_until_cleared(node):
    run_health(node, [DBE])
    state = node / "state" / STATE_FILE
    assert '"boot_id": "boot-1"' in state.read_text()
    assert [p.name for p in (node / "state").iterdir()] == [STATE_FILE]  # no temp file left
    state.write_text("{not json")
    report = run_health(node, [DBE])
    unread = [f for f in report.findings if f.check == "health.state"]
    assert [f.status for f in unread] == [Status.FAIL] and unread[0].action == "drain-node"
    assert [s for s, _ in _xids(report)] == ["FAIL"]  # afresh: the DBE is raised again
    assert [f.status for f in run_health(node, [DBE]).findings if f.check == "health.state"] == [
        Status.FAIL]  # not known to be healthy until --set-healthy


def test_the_report_says_what_cleared_since_the_previousrun_health(node):
    run_health(node, [PUSH])
    second = run_health(node, [PUSH])
    data = second.section("health").data
    assert data["previous"]["verdict"] == "WARN"
    assert data["cleared_since_previous"] == [
        "kernel_log.xid on GPU 0 (NVIDIA H200, bus 00000000:18:00.0, "
        "GPU-00000000-0000-0000-0000-000000000000)"]
