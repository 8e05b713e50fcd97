"""The kernel log's Xid section: one row per (GPU, XID), each GPU named by NVML, each
row judged by `xid_table.judge_xid` on the line's own words (docs/xid.md).

The log is read by `gpucheck.probes.kernel_log` (phase 1 of env, no NVML needed);
this module builds the section once NVML has named the GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpucheck import subject as subjects
from gpucheck.checks.check import table_cause
from gpucheck.devices import normal_bus_id
from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.kernel_log import TITLE, KernelLog, XidEvent
from gpucheck.probes.xid_table import SEVERITIES, XidInfo, judge_xid
from gpucheck.report import Finding, Section, fail, ok, skip, warn


@dataclass(frozen=True)
class XidClass:
    """Every event of one XID on one GPU: how many, the first and last time, the
    verdict, and the sample of the line that decided it."""

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
    """The verdict of one (GPU, XID) and the line behind it: for XID 154 the last line
    (the recovery action the GPU is in now: a later "to 0x0 (None)" means it was done),
    for any other the worst line (one fatal NVLink line among non-fatal ones)."""
    judged = [(judge_xid(xid, e.detail, companions), e) for e in seen]
    if xid == 154:
        return judged[-1]
    return max(judged, key=lambda pair: SEVERITIES.index(pair[0].severity))


def group_events(events: Iterable[XidEvent]) -> list[XidClass]:
    """One class per (GPU, XID), in order of first appearance.

    The driver often logs an Xid 79 line *and* a "fallen off the bus" line for the
    same loss: the latter counts only for a GPU with no Xid 79 line of its own.
    """
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
    """A GPU fault finding of the section and what it is about, as data: the GPU's bus
    id (normal form) and the XID number. `gpucheck.health.faults` remembers a fault by
    these, never by the finding's words or the GPU's label (which changes when NVML
    stops naming a GPU that fell off the bus)."""

    bus_id: str
    xid: int
    finding: Finding


@dataclass(frozen=True)
class GpuName:
    """How a finding names a GPU, and its NVML index when this machine has it."""

    label: subjects.Subject  # its words are how the report names the GPU
    nvml_index: int | None


def log_pci_name(bus_id: str) -> str:
    """"0000:B3:00.0" -> "0000:b3:00", the form of the driver's Xid lines: one GPU gets
    one name whether a line wrote 0000:b3:00, 0000:b3:00.0 or 00000000:B3:00.0."""
    head, _, function = bus_id.lower().rpartition(".")
    return head if head and function == "0" else bus_id.lower()


def gpu_name(bus_id: str, gpus: Sequence[GpuRecord], log_uuids: dict[str, str]) -> GpuName:
    """NVML's name for the GPU at this bus id, as every section names it
    ("GPU 3 (NVIDIA H200, bus 00000000:3B:00.0, GPU-...)"), else its PCI id as the
    driver writes it.

    A saved log from another machine can name a bus this one also has: when the log
    gives that GPU's UUID and NVML's differs, it is not the same GPU, so it stays unnamed.
    """
    log_uuid = log_uuids.get(bus_id)
    for gpu in gpus:
        if normal_bus_id(gpu.pci_bus_id) != bus_id:
            continue
        if log_uuid and gpu.uuid and log_uuid != gpu.uuid:
            break
        return GpuName(gpu.subject, gpu.index)
    words = f"PCI:{log_pci_name(bus_id)}" + (f" ({log_uuid})" if log_uuid else "")
    return GpuName(subjects.gpu(None, words, bus_id=bus_id, uuid=log_uuid), None)


def _row(group: XidClass, name: GpuName) -> dict[str, object]:
    info = group.info
    return {"gpu": name.label, "xid": group.xid, "count": group.count, "first": group.first,
            "last": group.last, "meaning": info.meaning, "severity": info.severity,
            "action": info.action, "sample": group.sample}


def _fault_finding(group: XidClass, name: GpuName, source: str) -> Finding:
    info = group.info
    when = "once" if group.count == 1 else f"{group.count} times"
    if group.first is not None:  # `dmesg -t` logs carry no time at all
        when += (f" at {group.first}" if group.count == 1
                 else f", first {group.first}, last {group.last}")
    message = (f"XID {group.xid} ({info.meaning}) {when} in the kernel log ({source}): "
               f"{group.sample}")
    index = "<index>" if name.nvml_index is None else str(name.nvml_index)
    hint = info.advice.replace("<index>", index)
    verdict = fail if info.severity == "fail" else warn
    return verdict("kernel_log.xid", message, hint, name.label, cause=table_cause(info.action))


def _summary_finding(log: KernelLog, app_level: list[str], faults: int,
                     reported_before: int) -> Finding | None:
    """OK when nothing in the log is a GPU fault; app-level XIDs are listed as information."""
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
    """The section, and each of its GPU fault findings with its bus id and XID.
    `reported_before`: Xid lines a previous check already reported (`gpucheck health`
    passes only the newer ones in `log.events`), so the all-clear says what it covers."""
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
        rows.append(_row(group, name))
        if group.info.severity == "info":
            app_level.append(f"XID {group.xid} ({group.info.meaning}) x{group.count} "
                             f"on {name.label}")
        else:
            faults.append(XidFault(group.bus_id, group.xid,
                                   _fault_finding(group, name, log.source)))
    data["xids"] = rows
    summary = _summary_finding(log, app_level, len(faults), reported_before)
    section.findings.extend([*(f.finding for f in faults), *([summary] if summary else [])])
    return section, faults
