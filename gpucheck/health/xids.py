"""Xid lines since the last check (each consumer's cursor: count, chain hash, tail
fingerprints), and the faults that stay reported until a reboot or `--set-healthy`
clears them (docs/health.md, "State")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpucheck.checks.check import table_cause
from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.xid_section import KernelLog, XidEvent, XidFault, kernel_log_part
from gpucheck.report import Finding, Section, Status
from gpucheck.subject import Kind, Subject, text

TAIL_LINES = 32


def _digest(text: str) -> str:
    import hashlib  # only when there are Xid lines: loading OpenSSL costs ~10 ms

    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:24]


def fingerprint(event: XidEvent) -> str:
    return _digest("|".join(str(v) for v in (event.bus_id, event.xid, event.time,
                                             event.detail, event.off_bus_line, event.instance)))


def _chain(prints: Sequence[str]) -> str:
    return _digest("\n".join(prints))  # fingerprints: ASCII, as UTF-8


def _tail_end(prints: Sequence[str], tail: Sequence[str]) -> int:
    """Where the remembered tail ends in a log that lost its oldest lines (the earliest
    fit), 0 where none."""
    for end in range(1, len(prints) + 1):
        size = min(end, len(tail))
        if list(prints[end - size:end]) == list(tail[len(tail) - size:]):
            return end
    return 0


def start_of_new(prints: Sequence[str], cursor: dict[str, Any]) -> int:
    """How many of the log's Xid lines the cursor had read."""
    count, chain, tail = cursor.get("count"), cursor.get("chain"), cursor.get("tail") or []
    if isinstance(count, int) and 0 < count <= len(prints) and chain == _chain(prints[:count]):
        return count
    return _tail_end(prints, tail) if tail else 0


def cursor_of(log: KernelLog) -> dict[str, Any]:
    """Where a reader of all of `log` stands (also what `--set-healthy` clears up to)."""
    prints = [fingerprint(e) for e in log.events]
    return {"count": len(prints), "chain": _chain(prints) if prints else None,
            "tail": prints[-TAIL_LINES:], "source": log.source}


@dataclass(frozen=True)
class XidPart:
    """The kernel-log section of the new lines, their GPU faults, the cursor to keep."""

    section: Section
    cursor: dict[str, Any]
    faults: tuple[XidFault, ...] = ()


def xid_section(log: KernelLog | None, cursor: dict[str, Any], same_boot: bool,
                gpus: Sequence[GpuRecord], error: str | None = None) -> XidPart:
    """The section of the new lines (the old cursor when no log could be read: nothing
    was seen, nothing moves)."""
    if log is None or log.source is None:
        section, faults = kernel_log_part(log, gpus, error)
        return XidPart(section, dict(cursor), tuple(faults))
    start = start_of_new([fingerprint(e) for e in log.events], cursor) if same_boot else 0
    new = tuple(log.events)[start:]
    section, faults = kernel_log_part(replace(log, events=new), gpus, reported_before=start)
    section.data.update(xid_lines_new=len(new), xid_lines_reported_before=start)
    return XidPart(section, cursor_of(log), tuple(faults))


# --- faults that stay reported (a reboot or --set-healthy clears them) -------

STICKY_ACTIONS = ("reset-gpu", "drain-node", "replace-hardware")
CLEARED_BY_REBOOT = ("reset-gpu", "drain-node")
XID_CHECK = "kernel_log.xid"


def fault_key(bus_id: str, xid: int) -> str:
    """A fault's identity: check, bus id, XID (not the GPU's label, which NVML may not
    give next run)."""
    return f"{XID_CHECK}|{bus_id}|{xid}"


def new_faults(faults: Iterable[XidFault], boot_id: str | None,
               now: str) -> list[dict[str, Any]]:
    """The sticky faults among this run's new Xid findings, as state records."""
    found = []
    for fault in faults:
        finding, subject = fault.finding, fault.finding.subject
        if finding.check != XID_CHECK or finding.action not in STICKY_ACTIONS:
            continue
        found.append({"key": fault_key(fault.bus_id, fault.xid), "check": finding.check,
                      "status": finding.status.value, "action": finding.action,
                      "subject": finding.subject.label if finding.subject else None,
                      "subject_fields": subject.to_dict() if subject is not None
                      and subject.kind is not Kind.TEXT else None,
                      "message": finding.message[:1000],
                      "hint": (finding.hint or "")[:1000], "boot_id": boot_id, "since": now})
    return found


def _subject(fault: dict[str, Any]) -> Subject | None:
    """The remembered subject: its fields, else its words (an older file)."""
    fields, words = fault.get("subject_fields"), fault.get("subject")
    if fields is not None:
        return Subject.from_dict(fields)
    return text(words) if words else None


def carry(faults: Iterable[dict[str, Any]], boot_id: str | None,
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The remembered faults still reported, and those cleared (a reboot clears those a
    reset clears)."""
    still: list[dict[str, Any]] = []
    cleared: list[dict[str, Any]] = []
    for fault in faults:
        rebooted = boot_id is not None and fault.get("boot_id") not in (None, boot_id)
        (cleared if rebooted and fault["action"] in CLEARED_BY_REBOOT else still).append(fault)
    return still, cleared


def still_findings(still: Iterable[dict[str, Any]], raised: set[str]) -> list[Finding]:
    """A finding for each remembered fault not raised again by a new line this run."""
    findings = []
    for fault in still:
        if fault["key"] in raised:
            continue
        until = ("until a reboot, or `gpucheck health --set-healthy` after a GPU reset"
                 if fault["action"] in CLEARED_BY_REBOOT else "until the part is replaced "
                 "and `gpucheck health --set-healthy` is run")
        message = f"{fault['message']} (first reported {fault['since']}; reported {until})"
        findings.append(Finding(fault["check"], Status(fault["status"]), message,
                                fault.get("hint") or None, _subject(fault),
                                cause=table_cause(fault["action"])))
    return findings
