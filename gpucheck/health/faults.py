"""Faults that stay reported until what clears them has happened.

An Xid line is read once (`gpucheck.health.xids`), but the fault it reports does not
end there: a GPU that needs a reset still needs it on the next run, and a scheduler
recipe that resumes a node on the first clean run would put a broken GPU back in
service one interval after draining it. So an Xid finding whose action is
`reset-gpu`, `drain-node` or `replace-hardware` is remembered in the state dir (shared
by every consumer) and reported again on every run until:
- a reboot (another boot id) for `reset-gpu` and `drain-node`: the GPU was reset with
  the node (a GPU reset alone, `nvidia-smi -r`, does not change the boot id: say so
  with `--set-healthy`);
- `gpucheck health --set-healthy`, for every fault: a person says the fault was dealt
  with (the part was replaced, the GPU reset).
As gpud does: its Xid component stays unhealthy until a reboot clears a
reboot-class Xid or `gpud set-healthy` purges the stored events
(leptonai/gpud issue 1072, pull request 1126).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucheck.checks.check import table_cause
from gpucheck.probes.xid_section import XidFault
from gpucheck.report import Finding, Status
from gpucheck.subject import Kind, Subject, text

STICKY_ACTIONS = ("reset-gpu", "drain-node", "replace-hardware")
CLEARED_BY_REBOOT = ("reset-gpu", "drain-node")
XID_CHECK = "kernel_log.xid"


def fault_key(bus_id: str, xid: int) -> str:
    """A fault's identity: the check, the GPU's bus id and the XID number. Not the GPU's
    label: NVML names a GPU in one run and not in the next (it fell off the bus), and
    the same fault seen again must not be a new one."""
    return f"{XID_CHECK}|{bus_id}|{xid}"


def new_faults(faults: Iterable[XidFault], boot_id: str | None,
               now: str) -> list[dict[str, Any]]:
    """The sticky faults among this run's new Xid findings, as state records: each
    known by its data (`fault_key`), never by the words of its message."""
    found = []
    for fault in faults:
        finding = fault.finding
        if finding.check != XID_CHECK or finding.action not in STICKY_ACTIONS:
            continue
        found.append({"key": fault_key(fault.bus_id, fault.xid), "check": finding.check,
                      "status": finding.status.value, "action": finding.action,
                      "subject": finding.subject.label if finding.subject else None,
                      "subject_fields": _fields(finding.subject),
                      "message": finding.message[:1000],
                      "hint": (finding.hint or "")[:1000], "boot_id": boot_id, "since": now})
    return found


def _fields(subject: Subject | None) -> dict[str, Any] | None:
    """The subject's fields as the report's JSON keeps them (None for a name only)."""
    return subject.to_dict() if subject is not None and subject.kind is not Kind.TEXT else None


def _subject(fault: dict[str, Any]) -> Subject | None:
    """The remembered subject: its fields (checked by gpucheck.health.schema), else its
    words (a fault stored before the fields were)."""
    fields, words = fault.get("subject_fields"), fault.get("subject")
    if fields is not None:
        return Subject.from_dict(fields)
    return text(words) if words else None


@dataclass(frozen=True)
class Carried:
    """The faults still reported, and those this run saw cleared (by a reboot)."""

    still: list[dict[str, Any]]
    cleared: list[dict[str, Any]]


def carry(faults: Iterable[dict[str, Any]], boot_id: str | None) -> Carried:
    """Split the remembered faults: a reboot clears those a reset clears."""
    still: list[dict[str, Any]] = []
    cleared: list[dict[str, Any]] = []
    for fault in faults:
        rebooted = boot_id is not None and fault.get("boot_id") not in (None, boot_id)
        (cleared if rebooted and fault["action"] in CLEARED_BY_REBOOT else still).append(fault)
    return Carried(still, cleared)


def _until(action: str) -> str:
    if action in CLEARED_BY_REBOOT:
        return "until a reboot, or `gpucheck health --set-healthy` after a GPU reset"
    return "until the part is replaced and `gpucheck health --set-healthy` is run"


def still_findings(still: Iterable[dict[str, Any]], raised: set[str]) -> list[Finding]:
    """A finding for each remembered fault not raised again by a new line this run."""
    findings = []
    for fault in still:
        if fault["key"] in raised:
            continue
        message = (f"{fault['message']} (first reported {fault['since']}; reported "
                   f"{_until(fault['action'])})")
        findings.append(Finding(fault["check"], Status(fault["status"]), message,
                                fault.get("hint") or None, _subject(fault),
                                cause=table_cause(fault["action"])))
    return findings
