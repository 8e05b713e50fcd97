"""The kernel log's Xid section (phase 2 of env, once NVML has named the GPUs): one row
per (GPU, XID), each judged by `xid_table.judge_xid` on the line's own words (docs/xid.md)."""

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


def log_pci_name(bus_id: str) -> str:
    """"0000:B3:00.0" -> "0000:b3:00", the form of the driver's Xid lines."""
    head, _, function = bus_id.lower().rpartition(".")
    return head if head and function == "0" else bus_id.lower()


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
    words = f"PCI:{log_pci_name(bus_id)}" + (f" ({log_uuid})" if log_uuid else "")
    return subjects.gpu(None, words, bus_id=bus_id, uuid=log_uuid)


def _row(group: XidClass, name: subjects.Subject) -> dict[str, object]:
    info = group.info
    return {"gpu": name.label, "xid": group.xid, "count": group.count, "first": group.first,
            "last": group.last, "meaning": info.meaning, "severity": info.severity,
            "action": info.action, "sample": group.sample}


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
        rows.append(_row(group, name))
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
