"""Health remembers right: a fault that needs a reset or a reboot stays reported until
one happened (or `--set-healthy` says so); each consumer of a shared state dir reads
the kernel log for itself; identical Xid lines are each an event."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.health.state import STATE_FILE
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeNvml
from tests.health_fakes import BUS, DBE, PUSH, reboot, run_health, state_node, write_log, xid_line

REMAP = xid_line(120.0, BUS, 64, "ECC page retirement or row remapper recording failure")
STICKY = {  # each action that stays reported, by an Xid the catalog gives it
    "reset-gpu": DBE, "drain-node": xid_line(900.0, BUS, 79, "GPU has fallen off the bus."),
    "replace-hardware": REMAP}


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return state_node(tmp_path, monkeypatch)


_run = run_health


def _xid_problems(report: Report) -> list[tuple[str, str | None]]:
    return [(f.status.value, f.action) for f in report.section("kernel_log").findings
            if f.status in (Status.WARN, Status.FAIL)]


# ---- item 5: a fault stays until what clears it happened ----

@pytest.mark.parametrize("action", sorted(STICKY))
def test_a_fault_needing_a_reset_stays_reported_on_later_clean_runs(node, action):
    first = _run(node, [STICKY[action]])
    assert _xid_problems(first) == [("FAIL", action)]
    for _ in range(2):
        later = _run(node)  # the line is read, nothing new: the fault is still there
        assert _xid_problems(later) == [("FAIL", action)]
        assert later.section("kernel_log").data["xid_lines_new"] == 0
        assert later.verdict() is Status.FAIL


def test_a_reboot_clears_a_reset_fault_but_not_a_part_to_replace(node):
    _run(node, [DBE, REMAP])
    reboot(node, "boot-2")
    report = _run(node, [])
    assert _xid_problems(report) == [("FAIL", "replace-hardware")]
    cleared = report.section("health").data["faults_cleared"]
    assert len(cleared) == 1 and "|48 (cleared by a reboot)" in cleared[0]
    assert _xid_problems(_run(node, [])) == [("FAIL", "replace-hardware")]


def test_set_healthy_clears_every_fault_and_a_later_line_is_raised_again(node):
    _run(node, [DBE, REMAP])
    cleared = _run(node, set_healthy=True)
    assert _xid_problems(cleared) == [] and cleared.verdict() is Status.OK
    assert len(cleared.section("health").data["faults_cleared"]) == 2
    assert _xid_problems(_run(node)) == []
    again = xid_line(2000.0, BUS, 48, "An uncorrectable double bit error (DBE) has been detected.")
    assert _xid_problems(_run(node, [DBE, REMAP, again])) == [("FAIL", "reset-gpu")]


def test_set_healthy_moves_every_consumer_and_a_new_one_starts_there(node):
    _run(node, [DBE], consumer="prolog")  # the prolog saw it; the healthcheck not yet
    _run(node, set_healthy=True, consumer="operator")
    assert _xid_problems(_run(node, consumer="healthcheck")) == []
    assert _xid_problems(_run(node, consumer="prolog")) == []


def test_set_healthy_from_the_command_line(node, monkeypatch, capsys):
    _run(node, [DBE])
    argv = ["health", "--sysfs", str(node / "sys"), "--kernel-log", str(node / "dmesg.txt"),
            "--state-dir", str(node / "state"), "--format", "json"]
    monkeypatch.setattr("gpucheck.health.state.read_boot_id", lambda proc=None: "boot-1")
    monkeypatch.setattr("gpucheck.health.run.read_boot_id", lambda proc=None: "boot-1")
    assert cli.main(argv) == 1
    capsys.readouterr()
    assert cli.main([*argv, "--set-healthy"]) == 0
    data = json.loads(capsys.readouterr().out)
    health = next(s for s in data["sections"] if s["name"] == "health")
    assert len(health["data"]["faults_cleared"]) == 1
    assert cli.main(argv) == 0


# ---- item 6: consumers of one state dir do not take each other's lines ----

def test_each_consumer_reads_every_line_for_itself(node):
    for consumer in ("prometheus-textfile", "slurm-healthcheck", "slurm-prolog"):
        assert _xid_problems(_run(node, [PUSH], consumer=consumer)) == [("WARN", "restart-app")]
    for consumer in ("prometheus-textfile", "slurm-healthcheck"):
        assert _xid_problems(_run(node, [PUSH], consumer=consumer)) == []
    state = json.loads((node / "state" / STATE_FILE).read_text())
    assert sorted(state["consumers"]) == ["prometheus-textfile", "slurm-healthcheck",
                                          "slurm-prolog"]


def test_a_fault_found_by_one_consumer_is_reported_by_every_other(node):
    _run(node, [DBE], consumer="prometheus-textfile")
    _run(node, [DBE], consumer="slurm-healthcheck")
    assert _xid_problems(_run(node, [DBE], consumer="slurm-healthcheck")) == [
        ("FAIL", "reset-gpu")]


def test_a_consumer_s_write_keeps_what_another_wrote_meanwhile(node):
    """Two runs at once: the later write re-reads the file, so neither loses the other's
    cursor nor a fault it found."""
    from gpucheck.health import state as state_module

    real = state_module.read_raw
    calls = {"n": 0}

    def other_writes_first(directory):
        calls["n"] += 1
        if calls["n"] == 2:  # between this run's load and its write
            _run(node, [DBE], consumer="prolog")
        return real(directory)

    state_module.read_raw = other_writes_first
    try:
        _run(node, [DBE], consumer="healthcheck")
    finally:
        state_module.read_raw = real
    stored = json.loads((node / "state" / STATE_FILE).read_text())
    assert sorted(stored["consumers"]) == ["healthcheck", "prolog"]
    assert [f["action"] for f in stored["faults"]] == ["reset-gpu"]


# ---- issue 25: a fault is known by its data (GPU bus id, XID), never by its words ----

UNCONTAINED = xid_line(130.0, BUS, 95, "Uncontained ECC error")  # FAIL reset-gpu, as 48


def test_the_same_fault_seen_again_is_not_new_when_nvml_no_longer_names_its_gpu(
        node, monkeypatch):
    first = _run(node, [DBE])
    assert _xid_problems(first) == [("FAIL", "reset-gpu")]
    (named,) = [f.subject for f in first.section("kernel_log").findings]
    assert named is not None and named.label.startswith("GPU 0 (")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]).module)  # the GPU is gone
    again = xid_line(200.0, BUS, 48, "An uncorrectable double bit error (DBE) has been detected.")
    report = _run(node, [DBE, again])
    faults = [f for f in report.section("kernel_log").findings if f.status is Status.FAIL]
    assert [(f.action, f.subject.label) for f in faults] == [("reset-gpu", "PCI:0000:18:00")]
    stored = json.loads((node / "state" / STATE_FILE).read_text())["faults"]
    assert [(f["key"], f["subject"]) for f in stored] == [
        ("kernel_log.xid|0000:18:00.0|48", named.label)]  # the first record, kept once
    assert report.section("kernel_log").data["still_reported"] == [
        "kernel_log.xid|0000:18:00.0|48"]


def test_two_faults_of_one_gpu_whose_messages_collide_are_told_apart(node):
    from dataclasses import replace

    from gpucheck.health.xids import new_faults
    from gpucheck.probes.kernel_log import read_kernel_log
    from gpucheck.probes.xid_section import XidFault, kernel_log_part

    log = read_kernel_log(str(write_log(node / "two.txt", [DBE, UNCONTAINED])))
    _, faults = kernel_log_part(log, [])
    same = [XidFault(f.bus_id, f.xid, replace(f.finding, message="GPU fault", hint="reset it"))
            for f in faults]  # the same words, the same GPU, the same action and status
    records = new_faults(same, "boot-1", "now")
    assert [(r["key"], r["action"], r["status"]) for r in records] == [
        ("kernel_log.xid|0000:18:00.0|48", "reset-gpu", "FAIL"),
        ("kernel_log.xid|0000:18:00.0|95", "reset-gpu", "FAIL")]
    # Through the runs: both remembered, both reported again on a later clean run.
    _run(node, [DBE, UNCONTAINED])
    assert _xid_problems(_run(node)) == [("FAIL", "reset-gpu"), ("FAIL", "reset-gpu")]


# ---- item 7: identical lines are each an event ----

@pytest.mark.parametrize("stamp", ["Nov 26 10:00:00 node7 kernel: ", "kernel: "])
def test_two_new_identical_lines_after_a_first_one_are_raised(node, stamp):
    line = f"{stamp}NVRM: Xid (PCI:{BUS}): 48, An uncorrectable double bit error (DBE).\n"
    (node / "dmesg.txt").write_text(line)
    _run(node)
    (node / "dmesg.txt").write_text(line * 3)
    report = _run(node)
    assert report.section("kernel_log").data["xid_lines_new"] == 2
    (row,) = report.section("kernel_log").data["xids"]
    assert row["count"] == 2
    assert _xid_problems(report) == [("FAIL", "reset-gpu")]


def test_more_consumers_than_the_file_keeps_drop_the_oldest_never_the_file(node):
    from gpucheck.health.state import MAX_CONSUMERS

    for i in range(MAX_CONSUMERS + 3):
        report = _run(node, [PUSH], consumer=f"job-{i}")
        assert not [f for f in report.findings if f.check == "health.state"]
    stored = json.loads((node / "state" / STATE_FILE).read_text())
    assert len(stored["consumers"]) == MAX_CONSUMERS
    assert f"job-{MAX_CONSUMERS + 2}" in stored["consumers"]
