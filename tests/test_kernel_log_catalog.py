"""Kernel-log XIDs judged against NVIDIA's current Xid catalog (R570 and later): XID 154's
recovery action, 109 as a GPU reset, the NVLink XIDs 144-150 by their own Fatal/Nonfatal
word, 48 with or without a 63/64, a GPU lost with no Xid line, MIG lines, and one GPU
whatever form its bus id takes. The lines are copied from kernel logs users posted
(sources in docs/xid.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.kernel_log import read_kernel_log
from gpucheck.probes.xid_section import kernel_log_section
from gpucheck.probes.xid_table import (
    ACTIONS,
    RECOVERY_ACTIONS,
    SEVERITIES,
    XID_TABLE,
    judge_xid,
    xid_info,
)
from gpucheck.report import Finding, Section, Status

B3 = GpuRecord(5, "NVIDIA H100 80GB HBM3", "GPU-b3000000-0000-0000-0000-000000000000",
               "00000000:B3:00.0")
B3_LABEL = f"GPU 5 (NVIDIA H100 80GB HBM3, bus 00000000:B3:00.0, {B3.uuid})"
BUCKETS = {"RESTART_APP", "RESET_GPU", "RESTART_BM", "IGNORE", "WORKFLOW_XID_45",
           "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154",
           "CHECK_MECHANICALS", "UPDATE_SWFW", "RESTART_VM", "CHECK_UVM"}


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
