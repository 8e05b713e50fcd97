"""What the driver's kernel records say (Xid lines, a lost GPU, a bus id's UUID) and the
Xid section built from them once NVML has named the GPUs: one row per (GPU, XID), judged
by `xid_table.judge_xid` on the line's own words (docs/xid.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpucheck import subject as subjects
from gpucheck.checks.check import table_cause
from gpucheck.devices import normal_bus_id
from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.xid_table import SEVERITIES, XidInfo, judge_xid
from gpucheck.report import Finding, Section, fail, ok, skip, warn

TITLE = "Kernel log: Xid errors"
SAMPLE_CHARS = 120

_PCI = r"(?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
# Matched at the start of a record's message only: any user can put text into the kernel
# log, and only the driver writes a record that starts with "NVRM:" (docs/xid.md).
# "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 94, ..." (MIG instances optional,
# "PCI:" absent on older drivers).
_XID_RE = re.compile(rf"NVRM: Xid \({_PCI}(?P<mig>(?:[ \t]+GPU-C?I:[ \t]*\d+)*)[ \t]*\):"
                     r"[ \t]*(?P<xid>\d+)\b,?[ \t]*(?P<detail>.*)")
_OFF_BUS_RE = re.compile(rf"NVRM: GPU (?:at )?{_PCI}:? (?:GPU )?has fallen off the bus")
_UUID_RE = re.compile(rf"NVRM: GPU at {_PCI}: (?P<uuid>GPU-[0-9A-Fa-f-]{{8,}})")
# A GPU lost with no Xid line: "NVRM: The NVIDIA GPU 0000:b3:00.0 ... has fallen off the
# bus", possibly wrapped over several NVRM: lines.
_LOST_RE = re.compile(rf"NVRM: The NVIDIA GPU {_PCI}")
_NVRM_TEXT = re.compile(r"NVRM:[ \t]*(.*)")
LOST_MESSAGE_LINES = 4  # NVRM: lines to read for "fallen off the bus" after its start


@dataclass(frozen=True)
class Record:
    """One kernel record: its time and its message's lines (split on "\\n" only)."""

    time: str | None
    lines: tuple[str, ...]

    @property
    def driver(self) -> bool:
        """The NVIDIA driver's record: its message starts with "NVRM:"."""
        return self.lines[0].startswith("NVRM:")


@dataclass(frozen=True)
class XidEvent:
    """One NVRM line: which GPU, which XID, when, and the driver's words."""

    bus_id: str  # normal form, "0000:3B:00.0"
    pci_id: str  # as the log wrote it, "0000:3b:00"
    xid: int
    time: str | None
    detail: str
    off_bus_line: bool = False  # a "fallen off the bus" line, not an Xid line
    instance: str | None = None  # on a MIG GPU, "GPU-I:05 GPU-CI:02"

    @property
    def sample(self) -> str:
        text = (f"[{self.instance}] {self.detail}" if self.instance else self.detail).strip()
        return text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS - 1] + "…"


@dataclass(frozen=True)
class KernelLog:
    """What was read: the source (None when none was readable) and the NVRM events."""

    source: str | None
    lines_scanned: int = 0
    events: tuple[XidEvent, ...] = ()
    uuids_by_bus: dict[str, str] = field(default_factory=dict)  # from "GPU at PCI:" lines
    not_read: tuple[str, ...] = ()  # why each source tried before (or instead) failed
    note: str | None = None


@dataclass
class _Lost:
    """A "The NVIDIA GPU <bus id>" message still being read (it may wrap)."""

    pci: str
    time: str | None
    text: list[str]


@dataclass
class Scan:
    lines: int = 0
    events: list[XidEvent] = field(default_factory=list)
    uuids: dict[str, str] = field(default_factory=dict)
    lost: _Lost | None = None


def _bus_id(pci: str) -> str:
    full = pci if "." in pci else f"{pci}.0"
    return normal_bus_id(full) or full


def parse_message(text: str, stamp: str | None) -> XidEvent | tuple[str, str] | None:
    """An Xid or fallen-off-the-bus event, a (bus id, UUID) pair, or None."""
    match = _XID_RE.match(text)
    if match:
        instance = " ".join(match["mig"].split()) or None
        return XidEvent(_bus_id(match["pci"]), match["pci"], int(match["xid"]), stamp,
                        match["detail"].strip()[:SAMPLE_CHARS * 4], instance=instance)
    match = _OFF_BUS_RE.match(text)
    if match:
        return XidEvent(_bus_id(match["pci"]), match["pci"], 79, stamp,
                        "GPU has fallen off the bus.", off_bus_line=True)
    match = _UUID_RE.match(text)
    if match:
        return _bus_id(match["pci"]), match["uuid"]
    return None


def _follow_lost(scan: Scan, text: str, stamp: str | None, parsed: bool) -> None:
    """Follow a "The NVIDIA GPU <bus id>" message over at most LOST_MESSAGE_LINES NVRM:
    lines; a line parsed as something else ends it."""
    if parsed:
        scan.lost = None
        return
    start = _LOST_RE.match(text)
    if start is not None:
        scan.lost = _Lost(start["pci"], stamp, [])
    said_here = _NVRM_TEXT.match(text)
    if scan.lost is None or said_here is None:
        return
    scan.lost.text.append(said_here[1].strip())
    said = " ".join(scan.lost.text)
    if "fallen off the bus" in said:
        lost = scan.lost
        scan.events.append(XidEvent(_bus_id(lost.pci), lost.pci, 79, lost.time, said,
                                    off_bus_line=True))
        scan.lost = None
    elif len(scan.lost.text) >= LOST_MESSAGE_LINES:  # another message ("not supported")
        scan.lost = None


def scan_records(records: Iterable[Record], scan: Scan | None = None) -> Scan:
    scan = scan or Scan()
    for record in records:
        if not record.driver:
            continue
        for text in record.lines:
            parsed = parse_message(text, record.time)
            if isinstance(parsed, XidEvent):
                scan.events.append(parsed)
            elif parsed is not None:
                scan.uuids[parsed[0]] = parsed[1]
            _follow_lost(scan, text, record.time, parsed is not None)
    return scan


@dataclass(frozen=True)
class XidClass:
    """Every event of one XID on one GPU, its verdict and the line that decided it."""

    bus_id: str
    pci_id: str
    xid: int
    count: int
    first: str | None
    last: str | None
    sample: str
    info: XidInfo


def _verdict(xid: int, seen: Sequence[XidEvent],
             companions: set[int]) -> tuple[XidInfo, XidEvent]:
    """The verdict of one (GPU, XID) and its line: for XID 154 the last (the recovery
    action the GPU is in now), for any other the worst."""
    judged = [(judge_xid(xid, e.detail, companions), e) for e in seen]
    if xid == 154:
        return judged[-1]
    return max(judged, key=lambda pair: SEVERITIES.index(pair[0].severity))


def group_events(events: Iterable[XidEvent]) -> list[XidClass]:
    """One class per (GPU, XID), in order of first appearance; a "fallen off the bus"
    line counts only for a GPU with no Xid 79 line of its own."""
    groups: dict[tuple[str, int], list[XidEvent]] = {}
    off_bus: dict[tuple[str, int], list[XidEvent]] = {}
    for event in events:
        target = off_bus if event.off_bus_line else groups
        target.setdefault((event.bus_id, event.xid), []).append(event)
    for key, lost in off_bus.items():
        groups.setdefault(key, lost)
    companions: dict[str, set[int]] = {}
    for bus, xid in groups:
        companions.setdefault(bus, set()).add(xid)
    classes = []
    for (bus, xid), seen in groups.items():
        info, decider = _verdict(xid, seen, companions[bus] - {xid})
        classes.append(XidClass(bus, seen[0].pci_id, xid, len(seen), seen[0].time,
                                seen[-1].time, decider.sample, info))
    return classes


@dataclass(frozen=True)
class XidFault:
    """A fault finding with its GPU's bus id and XID: health remembers a fault by these,
    never by words or label (a lost GPU's label changes)."""

    bus_id: str
    xid: int
    finding: Finding


def gpu_name(bus_id: str, gpus: Sequence[GpuRecord],
             log_uuids: dict[str, str]) -> subjects.Subject:
    """NVML's name for the GPU at this bus id, else its PCI id as the driver writes it (a
    saved log's GPU whose UUID differs from NVML's is another machine's: unnamed)."""
    log_uuid = log_uuids.get(bus_id)
    for gpu in gpus:
        if normal_bus_id(gpu.pci_bus_id) != bus_id:
            continue
        if log_uuid and gpu.uuid and log_uuid != gpu.uuid:
            break
        return gpu.subject
    # "0000:B3:00.0" -> "0000:b3:00", the form of the driver's Xid lines.
    head, _, function = bus_id.lower().rpartition(".")
    pci = head if head and function == "0" else bus_id.lower()
    words = f"PCI:{pci}" + (f" ({log_uuid})" if log_uuid else "")
    return subjects.gpu(None, words, bus_id=bus_id, uuid=log_uuid)


def _fault_finding(group: XidClass, name: subjects.Subject, source: str) -> Finding:
    info = group.info
    when = "once" if group.count == 1 else f"{group.count} times"
    if group.first is not None:  # `dmesg -t` logs carry no time at all
        when += (f" at {group.first}" if group.count == 1
                 else f", first {group.first}, last {group.last}")
    message = (f"XID {group.xid} ({info.meaning}) {when} in the kernel log ({source}): "
               f"{group.sample}")
    index = "<index>" if name.gpu is None else str(name.gpu)
    hint = info.advice.replace("<index>", index)
    verdict = fail if info.severity == "fail" else warn
    return verdict("kernel_log.xid", message, hint, name, cause=table_cause(info.action))


def _summary_finding(log: KernelLog, app_level: list[str], faults: int,
                     reported_before: int) -> Finding | None:
    """OK when nothing is a GPU fault; app-level XIDs are listed as information."""
    where = f"source: {log.source}, {log.lines_scanned} lines"
    if app_level:
        only = "" if faults else " only"
        return ok("kernel_log.xid", f"XIDs that need no action on the GPU{only} "
                  f"(application-level or informational, not a GPU fault; {where}): "
                  + "; ".join(app_level))
    if faults:
        return None
    none_new = (f"no new Xid since the last check ({reported_before} earlier line(s) already "
                "reported, not raised again)" if reported_before else "no Xid in the kernel log")
    return ok("kernel_log.xid", f"{none_new} ({where})")


def _unread_section(log: KernelLog | None, error: str | None) -> Section:
    """The section when no log could be read, or the probe itself broke."""
    if error is not None or log is None:
        error = error or "no result"
        return Section("kernel_log", TITLE, {"probe_error": error}, [fail(
            "kernel_log.probe", f"the kernel log probe failed: {error}",
            "run it again with --format json and report a gpucheck bug with the output")])
    tried = "; ".join(log.not_read) or "no source"
    return Section("kernel_log", TITLE, {"source": None, "not_read": list(log.not_read)}, [skip(
        "kernel_log.read", f"no kernel log this user can read ({tried}): run as root, or save "
        "it with `sudo dmesg > dmesg.txt` and pass --kernel-log dmesg.txt")])


def kernel_log_section(log: KernelLog | None, gpus: Sequence[GpuRecord],
                       error: str | None = None) -> Section:
    """Phase 2: the Xid history, each GPU named as NVML names it (`nvidia-smi -i N`)."""
    return kernel_log_part(log, gpus, error)[0]


def kernel_log_part(log: KernelLog | None, gpus: Sequence[GpuRecord],
                    error: str | None = None,
                    reported_before: int = 0) -> tuple[Section, list[XidFault]]:
    """The section and its fault findings with their bus id and XID; `reported_before`:
    Xid lines an earlier health check reported (the all-clear says what it covers)."""
    if log is None or log.source is None:
        return _unread_section(log, error), []
    data: dict[str, object] = {"source": log.source, "lines_scanned": log.lines_scanned}
    if log.not_read:
        data["not_read"] = list(log.not_read)
    if log.note:
        data["note"] = log.note
    section = Section("kernel_log", TITLE, data)
    if log.lines_scanned == 0:
        section.findings.append(skip("kernel_log.read", f"the kernel log ({log.source}) is "
                                     "empty: nothing to check"))
        return section, []
    rows, app_level, faults = [], [], []
    for group in group_events(log.events):
        name = gpu_name(group.bus_id, gpus, log.uuids_by_bus)
        info = group.info
        rows.append({"gpu": name.label, "xid": group.xid, "count": group.count,
                     "first": group.first, "last": group.last, "meaning": info.meaning,
                     "severity": info.severity, "action": info.action, "sample": group.sample})
        if group.info.severity == "info":
            app_level.append(f"XID {group.xid} ({group.info.meaning}) x{group.count} "
                             f"on {name}")
        else:
            faults.append(XidFault(group.bus_id, group.xid,
                                   _fault_finding(group, name, log.source)))
    data["xids"] = rows
    summary = _summary_finding(log, app_level, len(faults), reported_before)
    section.findings.extend([*(f.finding for f in faults), *([summary] if summary else [])])
    return section, faults
