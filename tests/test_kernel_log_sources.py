"""An Xid counts only when its whole record is the NVIDIA driver's (issue 34, item 1):
records split on "\\n" only, a continuation line never starts one, the structured
sources (/dev/kmsg, `journalctl -o json`) give each record's facility and whole text,
and every saved-log format an administrator keeps is read, with and without "PCI:"."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpucheck.health.run import HealthOptions, collect_health_report
from gpucheck.probes import kernel_log as kl
from gpucheck.probes.kernel_log import read_file, read_live_log, scan_lines
from gpucheck.report import Status
from tests.fake_pynvml import FakeGpu, FakeNvml

BUS = "0000:3b:00"
XID = "NVRM: Xid ({pci}): 79, pid=1288, name=python, GPU has fallen off the bus."
# Where each tool puts the kernel's message (dmesg, dmesg -T, dmesg -x, dmesg -r,
# journalctl -k short and short-iso with and without the host, syslog, kern.log with
# dmesg's stamp kept, `dmesg --time-format iso`, a bare "kernel:" tag, /dev/kmsg).
FORMS = [
    "[ 1283.204000] {msg}",
    "[Mon May 18 19:02:39 2026] {msg}",
    "kern  :err   : [ 1283.204000] {msg}",
    "<3>[ 1283.204000] {msg}",
    "May 18 19:02:39 node7 kernel: {msg}",
    "May 18 19:02:39 kernel: {msg}",
    "May  8 19:02:39 node7 kernel: [ 1283.204000] {msg}",
    "2026-05-18T19:02:39+0000 node7 kernel: {msg}",
    "2026-05-18T19:02:39+0000 kernel: {msg}",
    "2026-05-18T19:02:39.123456+00:00 node7 kernel: {msg}",
    "2026-05-18T19:02:39,123456+00:00 {msg}",
    "kernel: {msg}",
    "3,812,1283204000,-;{msg}",
]
SEPARATORS = ["\v", "\f", "\r", "\n"]


def _forged(sep: str) -> str:
    """What `mount -t tmpfs -o "zzz${sep}NVRM: Xid ..." none DIR` makes the kernel log."""
    return f"tmpfs: Unknown parameter 'zzz{sep}{XID.format(pci='PCI:' + BUS)}'"


def _dmesg(message: str, stamp: str = "[ 1283.204000] ") -> str:
    """As dmesg prints a record: its next lines indented under the first."""
    first, *rest = message.split("\n")
    return "".join([stamp + first + "\n", *(" " * len(stamp) + r + "\n" for r in rest)])


def _kmsg(message: str, facility: int = 0, level: int = 3) -> str:
    """As /dev/kmsg gives a record: control characters escaped, then its properties."""
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or c == "\\" else c for c in message)
    return f"{facility * 8 + level},812,1283204000,-;{escaped}\n SUBSYSTEM=pci\n"


def _journal(message: str, transport: str = "kernel") -> str:
    return json.dumps({"_TRANSPORT": transport, "SYSLOG_FACILITY": "0",
                       "_SOURCE_MONOTONIC_TIMESTAMP": "1283204000", "MESSAGE": message}) + "\n"


@pytest.mark.parametrize("pci", [f"PCI:{BUS}", BUS])
@pytest.mark.parametrize("form", FORMS)
def test_the_drivers_xid_is_read_in_every_saved_format_with_and_without_pci(
        form: str, pci: str, tmp_path: Path) -> None:
    log = tmp_path / "saved.log"
    log.write_text(form.format(msg="Linux version 6.8.0") + "\n"
                   + form.format(msg=XID.format(pci=pci)) + "\n")
    (event,) = read_file(str(log)).events
    assert (event.xid, event.bus_id, event.time is not None or form.startswith("kernel:")) == (
        79, "0000:3B:00.0", True)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_a_forged_xid_in_a_mount_option_is_no_xid_in_any_source(sep: str) -> None:
    real = XID.format(pci=f"PCI:{BUS}").replace("79", "48")
    text_forms = [_dmesg(_forged(sep)), _kmsg(_forged(sep)),
                  "".join("May 18 19:02:39 node7 kernel: " + part + "\n"
                          for part in _forged(sep).split("\n")[:1])]
    for text in text_forms:
        assert scan_lines((text + _dmesg(real)).split("\n")).events[0].xid == 48
        assert scan_lines(text.split("\n")).events == []
    journal = list(kl.journal_records([_journal(_forged(sep)), _journal(real)]))
    assert [r.driver for r in journal] == [False, True]


@pytest.mark.parametrize("line", [
    "            NVRM: Xid (PCI:0000:3b:00): 79 pwned'",  # a continuation line
    "\tNVRM: Xid (PCI:0000:3b:00): 79 pwned'",
    "NVRM: Xid (PCI:0000:3b:00): 79, no source form: whose it is is not known",
    "14,812,1283204000,-;NVRM: Xid (PCI:0000:3b:00): 79, written to /dev/kmsg by a program",
    "<13>[ 1283.2] NVRM: Xid (PCI:0000:3b:00): 79, facility user",
    "user  :err   : [ 1283.2] NVRM: Xid (PCI:0000:3b:00): 79, facility user",
    "May 18 19:02:39 node7 alice: NVRM: Xid (PCI:0000:3b:00): 79, another program's tag",
])
def test_a_line_that_is_not_the_start_of_a_kernel_record_is_never_an_xid(line: str) -> None:
    assert scan_lines([line]).events == []
    assert scan_lines(["[ 1.0] usb 1-1: new device\n", line + "\n"]).events == []


def test_a_journal_entry_not_from_the_kernel_transport_is_left_out() -> None:
    entries = [_journal(XID.format(pci=BUS), transport="syslog"), "not json\n", "[]\n",
               json.dumps({"_TRANSPORT": "kernel", "MESSAGE": list(XID.format(pci=BUS)
                                                                     .encode())}) + "\n"]
    records = list(kl.journal_records(entries))
    assert [(r.driver, r.time) for r in records] == [(True, None)]


def test_the_rest_of_an_over_long_line_never_starts_a_record(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    padding = "x" * (kl.MAX_LINE_BYTES - len("[ 1.0] tmpfs: '"))
    log.write_text(f"[ 1.0] tmpfs: '{padding}" + XID.format(pci=BUS) + "'\n")
    assert read_file(str(log)).events == ()


def _runner(kmsg: str | None = None, journal: str | None = None,
            dmesg: str | None = None):
    answers = {kl.KMSG_SOURCE: kmsg, "journalctl": journal, "dmesg": dmesg}

    def run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        answer = answers[argv[0]]
        if answer is None:
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(list(argv), 0, answer, "")
    return run


def test_the_structured_sources_come_first_and_keep_records_whole() -> None:
    forged = _forged("\n")
    log = read_live_log(_runner(kmsg=_kmsg(forged), journal=_journal(forged),
                                dmesg=_dmesg(XID.format(pci=BUS))))
    assert log.source == "/dev/kmsg" and log.events == ()
    log = read_live_log(_runner(journal=_journal(forged) + _journal(XID.format(pci=BUS))))
    assert log.source == "journalctl -k -b" and [e.xid for e in log.events] == [79]


def test_kmsg_is_read_to_its_end_without_waiting(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tmp_path / "kmsg"
    saved.write_text(_kmsg("Linux version 6.8.0", level=5) + _kmsg(XID.format(pci=BUS)))
    monkeypatch.setattr(kl, "KMSG", str(saved))
    done = kl.run_command([kl.KMSG_SOURCE], 1.0)
    (event,) = scan_lines(done.stdout.split("\n")).events
    assert event.time == "1283.204000 s after boot"
    monkeypatch.setattr(kl, "KMSG", str(tmp_path))  # a directory: refused, not read
    with pytest.raises(OSError):
        kl.run_command([kl.KMSG_SOURCE], 1.0)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_health_on_a_live_log_with_a_forged_xid_stays_ok_and_a_real_one_drains(
        sep: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu()]).module)
    (tmp_path / "sys").mkdir()
    forged = _dmesg(_forged(sep))
    for text, verdict in ((forged, Status.OK), (forged + _dmesg(XID.format(pci=BUS)),
                                                Status.FAIL)):
        options = HealthOptions(budget_s=20, runner=_runner(dmesg=text),
                                sysfs=tmp_path / "sys", proc=tmp_path / "proc")
        report = collect_health_report(options)
        xids = [f for f in report.findings if f.check == "kernel_log.xid"
                and f.status is not Status.OK]
        assert report.section("kernel_log").data["source"] == "dmesg"
        assert (len(xids), xids[0].status if xids else Status.OK) == (
            int(verdict is Status.FAIL), verdict)
