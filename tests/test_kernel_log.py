"""Xid history from the kernel log: saved logs of each XID class, the live sources
(with fake command runners), the naming of GPUs by NVML, `--kernel-log`, and the XIDs
judged against NVIDIA's current Xid catalog (R570 and later: XID 154's recovery action,
109, the NVLink XIDs 144-150 by their own Fatal/Nonfatal word, 48 with or without a
63/64, a GPU lost with no Xid line, MIG lines), on lines copied from kernel logs users
posted (sources in docs/xid.md)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpucheck.cli import main
from gpucheck.probes import kernel_log as kl
from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.kernel_log import (
    read_file,
    read_kernel_log,
    read_live_log,
    scan_lines,
)
from gpucheck.probes.xid_section import SAMPLE_CHARS, KernelLog, kernel_log_section
from gpucheck.probes.xid_table import (
    ACTIONS,
    CATALOG_READ,
    CATALOG_URL,
    RECOVERY_ACTIONS,
    SEVERITIES,
    XID_TABLE,
    judge_xid,
    xid_info,
)
from gpucheck.report import Finding, Section, Status
from tests.fake_pynvml import FakeGpu, FakeNvml

LOGS = Path(__file__).parent / "data" / "kernel_logs"
GPU0 = GpuRecord(0, "NVIDIA H200", "GPU-00000000-0000-0000-0000-000000000000",
                 "00000000:18:00.0")
GPU1 = GpuRecord(1, "NVIDIA H200", "GPU-00000001-0000-0000-0000-000000000000",
                 "00000000:3B:00.0")
GPU1_LABEL = "GPU 1 (NVIDIA H200, bus 00000000:3B:00.0, GPU-00000001-0000-0000-0000-000000000000)"
SECRETS = ("hunter2-kernel-secret", "journal-secret-fingerprint", "alice")
B3 = GpuRecord(5, "NVIDIA H100 80GB HBM3", "GPU-b3000000-0000-0000-0000-000000000000",
               "00000000:B3:00.0")
B3_LABEL = f"GPU 5 (NVIDIA H100 80GB HBM3, bus 00000000:B3:00.0, {B3.uuid})"
BUCKETS = {"RESTART_APP", "RESET_GPU", "RESTART_BM", "IGNORE", "WORKFLOW_XID_45",
           "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154",
           "CHECK_MECHANICALS", "UPDATE_SWFW", "RESTART_VM", "CHECK_UVM"}


def section_of(name: str, gpus: Sequence[GpuRecord] = (GPU0, GPU1)) -> Section:
    return kernel_log_section(read_kernel_log(str(LOGS / name)), gpus)


def xid_findings(section: Section, xid: int) -> list:
    return [f for f in section.findings if f.message.startswith(f"XID {xid} ")]


def row_of(section: Section, xid: int) -> dict:
    (row,) = [r for r in section.data["xids"] if r["xid"] == xid]
    return row


# ---- verdicts from saved logs ----

def test_a_clean_log_is_ok_and_names_its_source():
    section = section_of("dmesg_clean.log")
    (finding,) = section.findings
    assert finding.status is Status.OK and finding.message.startswith("no Xid in the kernel log")
    assert section.data["xids"] == [] and section.data["lines_scanned"] == 5
    assert "dmesg_clean.log" in finding.message


def test_xid_79_fails_once_per_gpu_naming_it_by_nvml_index_bus_id_and_uuid():
    section = section_of("dmesg_fallen_off_bus.log")
    (finding,) = xid_findings(section, 79)
    assert finding.status is Status.FAIL and finding.subject.label == GPU1_LABEL
    assert finding.action == "drain-node" and finding.cause == "table.drain-node"
    # Two Xid 79 lines; the "fallen off the bus" line is the same loss, not a third.
    row = row_of(section, 79)
    assert row["count"] == 2 and row["action"] == "drain-node"
    assert (row["first"], row["last"]) == ("12345.678901 s after boot",
                                           "12346.001002 s after boot")


def test_a_fallen_off_the_bus_line_alone_still_fails_as_xid_79():
    log = kl.scan_lines(["[  9.0] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."])
    section = kernel_log_section(KernelLog("dmesg", log.lines, tuple(log.events)), [GPU1])
    (finding,) = xid_findings(section, 79)
    assert finding.status is Status.FAIL and finding.subject.label == GPU1_LABEL


def test_application_level_xids_alone_stay_ok_and_are_listed_as_information():
    section = section_of("dmesg_T_app_level_only.log")
    (finding,) = section.findings
    assert finding.status is Status.OK and "not a GPU fault" in finding.message
    for xid in (13, 43, 31, 45):
        assert f"XID {xid} (" in finding.message and row_of(section, xid)["severity"] == "info"
    assert row_of(section, 13)["count"] == 2
    assert row_of(section, 13)["first"] == "Sat Nov 21 10:02:03 2026"  # dmesg -T stamps


def test_application_level_xids_next_to_a_gpu_fault_do_not_hide_it():
    section = section_of("dmesg_fallen_off_bus.log")
    statuses = sorted(f.status.value for f in section.findings)
    assert statuses == ["FAIL", "OK"]
    (info,) = [f for f in section.findings if f.status is Status.OK]
    assert "XID 13 (" in info.message and "XID 31 (" in info.message


@pytest.mark.parametrize(("xid", "status", "action"), [
    (94, Status.WARN, "restart-app"), (63, Status.WARN, "reset-gpu"),
    (48, Status.FAIL, "drain-node"),
    (64, Status.FAIL, "replace-hardware"), (95, Status.FAIL, "reset-gpu"),
    (74, Status.FAIL, "reset-gpu"), (119, Status.FAIL, "reset-gpu"),
    (120, Status.FAIL, "reset-gpu"),
])
def test_each_gpu_fault_xid_is_caught_with_its_status_and_action(xid, status, action):
    section = section_of("journal_ecc_and_gsp.log")
    (finding,) = xid_findings(section, xid)
    assert finding.status is status and finding.check == "kernel_log.xid"
    assert finding.action == action and finding.cause == f"table.{action}"
    assert row_of(section, xid)["action"] == action


def test_repeats_are_counted_with_the_first_and_last_time():
    section = section_of("journal_ecc_and_gsp.log")
    row = row_of(section, 94)
    assert (row["count"], row["first"], row["last"]) == (
        3, "2026-11-21T10:02:03+0000", "2026-11-21T10:07:44+0000")
    (finding,) = xid_findings(section, 94)
    assert "3 times, first 2026-11-21T10:02:03+0000, last 2026-11-21T10:07:44+0000" in (
        finding.message)


def test_an_unknown_xid_warns_pointing_at_nvidias_catalog_with_an_action():
    (finding,) = xid_findings(section_of("journal_ecc_and_gsp.log"), 250)
    assert finding.status is Status.WARN and "unknown XID 250" in finding.message
    assert "look it up in NVIDIA's Xid catalog" in finding.hint
    assert "docs.nvidia.com/deploy/xid-errors" in finding.hint
    assert finding.action == "rerun"


def test_xid_92_corrected_errors_are_information_as_the_catalog_says():
    section = section_of("journal_ecc_and_gsp.log")
    assert xid_findings(section, 92) == [] and row_of(section, 92)["severity"] == "info"
    (summary,) = [f for f in section.findings if f.status is Status.OK]
    assert "XID 92 (" in summary.message


def test_an_old_xid_line_without_pid_is_parsed_with_its_message():
    row = row_of(section_of("journal_ecc_and_gsp.log"), 48)
    assert row["sample"].startswith("An uncorrectable double bit error")


def test_garbage_lines_are_tolerated_and_only_the_real_xid_is_kept():
    log = read_kernel_log(str(LOGS / "garbage.log"))
    assert log.lines_scanned == 9
    assert [(e.xid, e.bus_id) for e in log.events] == [(62, "0000:01:00.0")]  # no "PCI:" prefix


def test_a_long_driver_message_is_truncated_in_the_report():
    row = row_of(section_of("journal_ecc_and_gsp.log"), 119)
    assert len(row["sample"]) == SAMPLE_CHARS and row["sample"].endswith("…")


def test_no_kernel_line_other_than_nvrm_fields_reaches_the_report():
    for name in ("dmesg_fallen_off_bus.log", "journal_ecc_and_gsp.log"):
        text = json.dumps(section_of(name).to_dict())
        assert not any(secret in text for secret in SECRETS)
        assert "Linux version" not in text and "apparmor" not in text


# ---- naming GPUs ----

def test_bus_ids_match_whatever_the_domain_width_and_case():
    upper = GpuRecord(1, "H200", GPU1.uuid, "00000000:3B:00.0")
    lower = GpuRecord(1, "H200", GPU1.uuid, "0000:3b:00.0")
    for gpu in (upper, lower):
        (finding,) = xid_findings(section_of("dmesg_fallen_off_bus.log", [gpu]), 79)
        assert finding.subject.label.startswith("GPU 1 (H200, bus ")


def test_a_gpu_nvml_does_not_know_is_named_by_its_pci_id_and_the_logs_uuid():
    section = section_of("journal_ecc_and_gsp.log", [GPU0])
    (finding,) = xid_findings(section, 94)
    assert finding.subject.label == "PCI:0000:86:00 (GPU-00000002-0000-0000-0000-000000000000)"
    (finding,) = xid_findings(section, 48)
    assert finding.subject.label == "PCI:0000:af:00" and "<index>" not in finding.hint


def test_a_log_from_another_machine_is_not_pinned_on_this_machines_gpu_at_that_bus():
    other = GpuRecord(7, "NVIDIA H200", "GPU-99999999-0000-0000-0000-000000000000",
                      "00000000:3B:00.0")
    (finding,) = xid_findings(section_of("dmesg_fallen_off_bus.log", [other]), 79)
    assert finding.subject.label == "PCI:0000:3b:00 (GPU-00000001-0000-0000-0000-000000000000)"


def test_the_reset_hint_names_the_mapped_gpus_nvml_index():
    (finding,) = xid_findings(section_of("garbage.log", [GpuRecord(4, "H200", None,
                                                                   "00000000:01:00.0")]), 62)
    assert "nvidia-smi -r -i 4" in finding.hint and finding.subject.label.startswith("GPU 4 ")


# ---- reading files ----

def test_a_saved_kern_log_is_read_whole_every_boot_in_it():
    path = str(LOGS / "kern_log_two_boots.log")
    assert [e.xid for e in read_file(path).events] == [79, 79, 43, 45]
    assert read_file(path).events[2].time == "Nov 21 10:02:03"


def test_a_gzipped_saved_log_is_read(tmp_path):
    packed = tmp_path / "dmesg.txt.gz"
    packed.write_bytes(gzip.compress((LOGS / "dmesg_fallen_off_bus.log").read_bytes()))
    assert [e.xid for e in read_kernel_log(str(packed)).events if not e.off_bus_line] == [
        13, 13, 31, 79, 79]


def test_only_the_tail_of_a_huge_log_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(kl, "MAX_READ_BYTES", 200)
    path = tmp_path / "kern.log"
    lines = [f"Nov 21 10:00:{i:02d} n kernel: NVRM: Xid (PCI:0000:18:00): 13, x\n"
             for i in range(20)]
    path.write_text("".join(lines))
    log = read_file(str(path))
    assert 0 < log.lines_scanned < 20 and log.note and "last" in log.note
    assert log.events[-1].time == "Nov 21 10:00:19"


def test_an_empty_saved_log_is_skipped_not_called_clean(tmp_path):
    empty = tmp_path / "dmesg.txt"
    empty.write_text("")
    (finding,) = kernel_log_section(read_kernel_log(str(empty)), [GPU0]).findings
    assert finding.status is Status.SKIP and "empty" in finding.message


# ---- the live sources, with fake runners ----

def runner(**answers):
    """A fake command runner: answers[command] is a CompletedProcess or an exception."""
    calls: list[tuple[str, float]] = []

    def run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        calls.append((argv[0], timeout_s))
        answer = answers.get(argv[0], FileNotFoundError(argv[0]))
        if isinstance(answer, BaseException):
            raise answer
        return answer
    run.calls = calls  # type: ignore[attr-defined]
    return run


def done(stdout: str = "", stderr: str = "", rc: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["x"], rc, stdout, stderr)


DENIED = done(stderr="dmesg: read kernel buffer failed: Operation not permitted\n", rc=1)
JOURNAL = "\n".join(json.dumps({
    "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": str(us),
    "MESSAGE": message}) for us, message in [
    (5_000_000, "NVRM: GPU at PCI:0000:86:00: GPU-00000002-0000-0000-0000-000000000000"),
    (9_000_000, "NVRM: Xid (PCI:0000:86:00): 94, pid=1234, name=python, Ch 00000008")]) + "\n"
NOT_ROOT = PermissionError(1, "Operation not permitted")


def test_dmesg_is_used_when_this_user_may_read_it():
    fake = runner(dmesg=done((LOGS / "dmesg_fallen_off_bus.log").read_text()))
    log = read_live_log(fake)
    assert log.source == "dmesg" and len(log.not_read) == 2
    assert fake.calls == [("/dev/kmsg", 5.0), ("journalctl", 10.0), ("dmesg", 5.0)]


def test_dmesg_restrict_falls_back_to_journalctl_and_says_why():
    log = read_live_log(runner(**{"/dev/kmsg": NOT_ROOT, "journalctl": done(JOURNAL)}))
    assert log.source == "journalctl -k -b" and 94 in {e.xid for e in log.events}
    assert log.events[0].time == "9.000000 s after boot"
    (reason,) = log.not_read
    assert reason == "/dev/kmsg: Operation not permitted"


def test_dmesg_restrict_is_named_when_dmesg_is_refused():
    log = read_live_log(runner(**{"/dev/kmsg": NOT_ROOT, "dmesg": DENIED}))
    assert log.source is None and "dmesg_restrict" in log.not_read[2]


def test_syslog_files_any_user_writes_are_never_read_unasked(monkeypatch):
    # `logger -t kernel "NVRM: Xid ..."` puts "<time> <host> kernel: NVRM: Xid ..." in
    # /var/log/messages (and kern.log), the very text the kernel's line has there.
    forged = KernelLog("/var/log/messages", 1, tuple(scan_lines([
        "Nov 26 10:00:00 node7 kernel: NVRM: Xid (PCI:0000:18:00): 79, off the bus"]).events))
    opened: list[str] = []
    monkeypatch.setattr(kl.os.path, "exists", lambda path: True)
    monkeypatch.setattr(kl, "read_file", lambda path, *a, **k: opened.append(path) or forged)
    empty = done("-- No entries --\n", "Hint: You are currently not seeing messages from other "
                 "users and the system.\n")
    log = read_live_log(runner(dmesg=DENIED, journalctl=empty, **{"/dev/kmsg": NOT_ROOT}))
    assert opened == [] and log.source is None and log.events == ()
    (finding,) = kernel_log_section(log, [GPU0]).findings
    assert finding.status is Status.SKIP and "logger -t kernel" in finding.message


def test_no_readable_source_is_a_skip_naming_each_reason():
    fake = runner(dmesg=FileNotFoundError("dmesg"),
                  journalctl=subprocess.TimeoutExpired("journalctl", 10.0))
    log = read_live_log(fake)
    section = kernel_log_section(log, [GPU0])
    (finding,) = section.findings
    assert finding.status is Status.SKIP and finding.check == "kernel_log.read"
    for reason in ("dmesg: not installed", "journalctl -k -b: no answer within 10 s",
                   "/dev/kmsg: absent", "kern.log", "--kernel-log"):
        assert reason in finding.message
    assert fake.calls == [("/dev/kmsg", 5.0), ("journalctl", 10.0), ("dmesg", 5.0)]


def test_the_real_runner_passes_its_timeout_and_reports_a_hang(monkeypatch):
    seen = {}

    def hanging_run(argv, **kwargs):
        seen.update(kwargs)
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
    monkeypatch.setattr(kl.subprocess, "run", hanging_run)
    monkeypatch.setattr(kl, "KMSG", "/nonexistent/kmsg")  # never this machine's log
    log = read_live_log()
    assert seen["timeout"] == kl.DMESG_TIMEOUT_S and seen["stdin"] is subprocess.DEVNULL
    assert log.source is None and "dmesg: no answer within 5 s" in log.not_read


def test_a_crashed_kernel_log_probe_is_a_fail_naming_the_error():
    (finding,) = kernel_log_section(None, [], "RuntimeError: boom").findings
    assert finding.status is Status.FAIL and "boom" in finding.message


# ---- gpucheck env --kernel-log ----

@pytest.mark.parametrize("bad", ["/nonexistent/dmesg.txt", "DIR"])
def test_an_unreadable_kernel_log_is_a_one_line_usage_error(bad, tmp_path, capsys):
    path = str(tmp_path) if bad == "DIR" else bad
    assert main(["env", "--kernel-log", path, "--no-gpu-test"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("gpucheck env: error: --kernel-log ")


def test_gpucheck_env_with_a_saved_dmesg_fails_naming_the_lost_gpu(tmp_path, monkeypatch):
    fake = FakeNvml([FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(bus_id="00000000:3B:00.0")])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    out = tmp_path / "report.json"
    rc = main(["env", "--kernel-log", str(LOGS / "dmesg_fallen_off_bus.log"), "--no-gpu-test",
               "--format", "json", "-o", str(out), "-q"])
    report = json.loads(out.read_text())
    (section,) = [s for s in report["sections"] if s["name"] == "kernel_log"]
    failed = [f for f in section["findings"] if f["status"] == "FAIL"]
    assert [f["subject"] for f in failed] == [GPU1_LABEL] and "XID 79" in failed[0]["message"]
    assert rc == 1 and report["verdict"] == "FAIL"
    assert not any(secret in out.read_text() for secret in SECRETS[:2])


def test_the_documented_xid_table_matches_the_code():
    doc = (Path(__file__).parents[1] / "docs" / "xid.md").read_text()
    assert CATALOG_URL in doc and CATALOG_READ in doc  # the catalog read, and when
    for xid, info in XID_TABLE.items():
        assert f"| {xid} | {info.meaning} | {info.severity} | `{info.action}` |" in doc


# ---- against NVIDIA's Xid catalog: single lines users posted ----

def section_for(tmp_path: Path, lines: str, gpus: Sequence[GpuRecord] = ()) -> Section:
    log = tmp_path / "dmesg.txt"
    log.write_text(lines)
    return kernel_log_section(read_kernel_log(str(log)), gpus)


def problems(section: Section) -> list[Finding]:
    return [f for f in section.findings if f.status in (Status.WARN, Status.FAIL)]


def only_problem(section: Section) -> Finding:
    (finding,) = problems(section)
    return finding


# ---- XID 154: the recovery action the line names ----

@pytest.mark.parametrize(("to", "action"), [
    ("0x1 (GPU Reset Required)", "reset-gpu"), ("0x2 (Node Reboot Required)", "drain-node"),
    ("0x2 (OS Reboot)", "drain-node"), ("0x3 (Drain P2P)", "drain-node"),
    ("0x4 (Drain and Reset)", "drain-node"), ("0x1 (PF FLR)", "reset-gpu")])
def test_xid_154_takes_the_recovery_action_its_line_names(tmp_path, to, action):
    line = (f"[ 3021.554301] NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed "
            f"from 0x0 (None) to {to}\n")
    finding = only_problem(section_for(tmp_path, line, [B3]))
    assert finding.status is Status.FAIL and finding.action == action
    assert finding.subject.label == B3_LABEL and "unknown XID" not in finding.message
    assert f"changed to {to.split('(')[1].rstrip(')')}" in finding.message


def test_xid_154_back_to_none_after_the_reset_is_no_longer_a_fault(tmp_path):
    lines = ("[ 3021.5] NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from "
             "0x0 (None) to 0x1 (GPU Reset Required)\n"
             "[ 3300.1] NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from "
             "0x1 (GPU Reset Required) to 0x0 (None)\n")
    section = section_for(tmp_path, lines, [B3])
    assert problems(section) == []
    (summary,) = section.findings
    assert summary.status is Status.OK and "XID 154 (GPU recovery action changed to None) x2" \
        in summary.message


def test_xid_154_with_a_value_gpucheck_does_not_know_still_asks_for_a_reset(tmp_path):
    line = "[ 9.0] NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from 0x0 " \
           "(None) to 0x9 (Something New)\n"
    finding = only_problem(section_for(tmp_path, line))
    assert finding.status is Status.WARN and finding.action == "reset-gpu"
    assert "nvmlGpuRecoveryAction_t" in finding.hint


def test_the_kernel_log_and_the_fault_watcher_read_recovery_actions_from_one_table():
    from gpucheck.faults import findings
    assert findings.RECOVERY_ACTIONS is RECOVERY_ACTIONS
    for code, known in RECOVERY_ACTIONS.items():
        line = f"GPU recovery action changed from 0x0 (None) to 0x{code:x} (x)"
        assert judge_xid(154, line).action == known.action


# ---- XID 109, 48, NVLink 144-150 ----

def test_xid_109_context_switch_timeout_is_a_gpu_reset(tmp_path):
    line = ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
            "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005\n")
    finding = only_problem(section_for(tmp_path, line))
    assert (finding.status, finding.action) == (Status.FAIL, "reset-gpu")
    assert finding.subject.label == "PCI:0000:cb:00"


@pytest.mark.parametrize(("detail", "status", "action"), [
    ("144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", Status.WARN, "restart-app"),
    ("144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)",
     Status.FAIL, "reset-gpu"),
    ("145, RLW_REMAP Nonfatal XC0 i0 Link 02", Status.WARN, "restart-app"),
    ("145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", Status.WARN, "restart-app"),
    ("149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", Status.FAIL, "reset-gpu"),
])
def test_nvlink_xids_144_to_150_follow_the_lines_own_fatal_or_nonfatal_word(
        tmp_path, detail, status, action):
    finding = only_problem(section_for(
        tmp_path, f"[171167.620236] NVRM: Xid (PCI:0000:b3:00): {detail}\n", [B3]))
    assert (finding.status, finding.action, finding.subject.label) == (status, action, B3_LABEL)
    assert detail.split()[1] in finding.message  # the unit, e.g. SAW_MVB


def test_one_fatal_nvlink_line_among_nonfatal_ones_fails_and_shows_the_fatal_line(tmp_path):
    lines = "".join(f"[ {t}.0] NVRM: Xid (PCI:0000:b3:00): 145, RLW_{w} XC0 i0 Link 02\n"
                    for t, w in ((10, "REMAP Nonfatal"), (11, "TAGSTATE Fatal"),
                                 (12, "REMAP Nonfatal")))
    finding = only_problem(section_for(tmp_path, lines))
    assert finding.status is Status.FAIL and "3 times" in finding.message
    assert "RLW_TAGSTATE Fatal" in finding.message


def test_xid_48_alone_is_a_reset_and_with_a_row_remap_failure_drains_the_node(tmp_path):
    dbe = "[ 5.0] NVRM: Xid (PCI:0000:b3:00): 48, An uncorrectable double bit error (DBE) " \
          "has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
    assert only_problem(section_for(tmp_path, dbe)).action == "reset-gpu"
    remap = "[ 5.1] NVRM: Xid (PCI:0000:b3:00): 64, pid=2001, name=python, Row Remapper " \
            "Error: Unable to remap row\n"
    found = {f.message.split()[1]: f.action for f in problems(section_for(tmp_path,
                                                                          dbe + remap))}
    assert found == {"48": "drain-node", "64": "replace-hardware"}


# ---- a GPU lost with no Xid line ----

LOST_ONE_LINE = ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:2330) "
                 "installed in this system has fallen off the bus and is not responding to "
                 "commands.\n")
LOST_WRAPPED_DMESG = ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                      "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                      "               NVRM: fallen off the bus and is not responding to "
                      "commands.\n"
                      "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n")
LOST_WRAPPED_JOURNAL = "".join(
    f"Nov 21 10:02:0{i} node7 kernel: NVRM: {text}\n" for i, text in enumerate((
        "The NVIDIA GPU 0000:b3:00.0", "(PCI ID: 10de:2330) installed in this system has",
        "fallen off the bus and is not responding to commands.")))


@pytest.mark.parametrize("lines", [LOST_ONE_LINE, LOST_WRAPPED_DMESG, LOST_WRAPPED_JOURNAL],
                         ids=["one line", "wrapped (dmesg)", "wrapped (journalctl)"])
def test_a_gpu_fallen_off_the_bus_with_no_xid_line_fails_naming_it(tmp_path, lines):
    for gpus, subject in (([B3], B3_LABEL), ([], "PCI:0000:b3:00")):
        section = section_for(tmp_path, lines, gpus)
        finding = only_problem(section)
        assert (finding.status, finding.action, finding.subject.label) == (
            Status.FAIL, "drain-node", subject)
        assert "fallen off the bus" in finding.message and "XID 79" in finding.message


def test_the_lost_message_and_an_xid_79_line_are_one_loss(tmp_path):
    lines = LOST_ONE_LINE + "[ 1843.3] NVRM: Xid (PCI:0000:b3:00): 79, pid=1288, " \
        "name=nvidia-smi, GPU has fallen off the bus.\n"
    finding = only_problem(section_for(tmp_path, lines))
    assert "once" in finding.message and "pid=1288" in finding.message


def test_a_gpu_the_driver_does_not_support_is_not_called_lost(tmp_path):
    lines = ("[ 14.1] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1c03)\n"
             "               NVRM: installed in this system is not supported by the\n"
             "               NVRM: NVIDIA 550.54.15 driver release.\n"
             "               NVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'\n"
             "[ 14.2] NVRM: GPU 0000:02:00.0: RmInitAdapter succeeded\n"
             "[ 99.0] usb 1-1: the mouse has fallen off the bus and is not responding\n")
    (finding,) = section_for(tmp_path, lines).findings
    assert finding.status is Status.OK and finding.message.startswith("no Xid")


def test_another_gpus_xid_79_after_an_unsupported_gpu_message_is_not_pinned_on_it(tmp_path):
    lines = ("[ 14.1] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1c03)\n"
             "               NVRM: installed in this system is not supported by the\n"
             "[ 14.2] NVRM: Xid (PCI:0000:b3:00): 79, pid=1, name=x, GPU has fallen off the "
             "bus.\n")
    finding = only_problem(section_for(tmp_path, lines))
    assert finding.subject.label == "PCI:0000:b3:00"


# ---- MIG, bus id forms, healthy logs ----

def test_a_mig_xid_line_is_parsed_and_keeps_its_gpu_instance(tmp_path):
    lines = ("[ 7.0] NVRM: Xid (PCI:0000:b3:00 GPU-I:05): 94, pid=7194, Contained: CE User "
             "Channel (0x9). RST: No, D-RST: No\n"
             "[ 8.0] NVRM: Xid (PCI:0000:b3:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, "
             "Graphics Exception\n")
    section = section_for(tmp_path, lines, [B3])
    finding = only_problem(section)
    assert (finding.status, finding.action, finding.subject.label) == (
        Status.WARN, "restart-app", B3_LABEL)
    assert "[GPU-I:05] pid=7194" in finding.message
    assert [r["xid"] for r in section.data["xids"]] == [94, 13]


def test_one_gpu_written_three_ways_is_one_gpu(tmp_path):
    lines = ("[ 1.0] NVRM: Xid (PCI:0000:b3:00): 62, pid=1, name=x, halt\n"
             "[ 2.0] NVRM: Xid (PCI:0000:b3:00.0): 62, pid=1, name=x, halt\n"
             "[ 3.0] NVRM: Xid (PCI:00000000:B3:00.0): 119, pid=2, name=y, Timeout\n")
    for gpus, subject in (([], "PCI:0000:b3:00"), ([B3], B3_LABEL)):
        section = section_for(tmp_path, lines, gpus)
        assert {f.subject.label for f in problems(section)} == {subject}
        assert [(r["xid"], r["count"]) for r in section.data["xids"]] == [(62, 2), (119, 1)]


def test_a_healthy_log_with_driver_lines_stays_ok(tmp_path):
    lines = ("[ 14.9] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  "
             "Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025\n"
             "[ 15.3] NVRM: GPU at PCI:0000:b3:00: GPU-b3000000-0000-0000-0000-000000000000\n"
             "[ 15.3] NVRM: GPU Board Serial Number: 1654123456789\n"
             "[ 16.0] NVRM: The NVIDIA probe routine was not called for 1 device(s).\n"
             "[ 20.0] NVRM: Persistence mode is deprecated and will be removed.\n")
    (finding,) = section_for(tmp_path, lines, [B3]).findings
    assert finding.status is Status.OK and finding.message.startswith("no Xid")


# ---- the table itself ----

def test_every_entry_keeps_the_catalogs_bucket_and_a_known_severity_and_action():
    for xid, info in XID_TABLE.items():
        assert info.xid == xid and info.severity in SEVERITIES and info.action in ACTIONS
        assert info.bucket and info.bucket in BUCKETS
    assert {x for x, i in XID_TABLE.items() if i.severity == "fail"} >= {48, 64, 74, 79, 95,
                                                                          119, 120}
    assert {x for x, i in XID_TABLE.items() if i.severity == "info"} >= {13, 31, 43, 45}
    assert (xid_info(109).action, xid_info(79).action, xid_info(13).severity) == (
        "reset-gpu", "drain-node", "info")
