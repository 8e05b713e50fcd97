"""Xid lines since the last check: the kernel log read by `gpucheck.probes.kernel_log`,
judged by `xid_table.judge_xid`, less what an earlier check already reported.

Without a state dir every Xid of this boot is raised (as `gpucheck env` does); with
one, the state keeps the fingerprint of the last Xid line reported, and only the
lines after it are raised, so an Xid raised once (and a node drained for it) is not
raised again after the GPU was reset. The cut survives what happens to logs:
- the kernel ring buffer wraps, or kern.log is rotated: the remembered line is gone,
  and since logs lose their oldest lines first, every line left is newer: all are new;
- a reboot (another boot id): the log is another boot's, every line in it is new.
A line is its fingerprint: GPU, XID, timestamp and the driver's words, so two equal
lines at two times are two events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.kernel_log import KernelLog, XidEvent
from gpucheck.probes.xid_section import kernel_log_section
from gpucheck.report import Finding, Section, ok

_NO_XID = "no Xid in the kernel log"


def fingerprint(event: XidEvent) -> str:
    import hashlib  # only when there are Xid lines: loading OpenSSL costs every run ~10 ms

    text = "|".join(str(v) for v in (event.bus_id, event.xid, event.time, event.detail,
                                     event.off_bus_line, event.instance))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:24]


@dataclass(frozen=True)
class XidCut:
    """The events not reported before, how many were, and the cursor to remember."""

    new: tuple[XidEvent, ...]
    reported_before: int
    cursor: dict[str, Any]


def cut_reported(log: KernelLog, cursor: dict[str, Any], same_boot: bool) -> XidCut:
    """Split the log's events at the last one an earlier check reported (see above)."""
    events = list(log.events)
    last = cursor.get("last_event") if same_boot else None
    seen = [i for i, event in enumerate(events) if last and fingerprint(event) == last]
    start = seen[-1] + 1 if seen else 0
    remembered = fingerprint(events[-1]) if events else last
    return XidCut(tuple(events[start:]), start,
                  {"last_event": remembered, "source": log.source})


def _reworded(finding: Finding, reported_before: int) -> Finding:
    """The all-clear says what it covers: only lines newer than the last check."""
    if finding.status.value != "OK" or not finding.message.startswith(_NO_XID):
        return finding
    rest = finding.message[len(_NO_XID):]
    return ok(finding.check, f"no new Xid since the last check ({reported_before} earlier "
              f"line(s) already reported, not raised again){rest}", finding.subject)


def xid_section(log: KernelLog | None, cursor: dict[str, Any], same_boot: bool,
                gpus: Sequence[GpuRecord], error: str | None = None) -> tuple[Section, dict]:
    """The kernel-log section of the new lines, and the cursor to remember (the old one
    when no log could be read: nothing was seen, nothing moves)."""
    if log is None or log.source is None:
        return kernel_log_section(log, gpus, error), dict(cursor)
    cut = cut_reported(log, cursor, same_boot)
    section = kernel_log_section(replace(log, events=cut.new), gpus)
    section.data.update(xid_lines_new=len(cut.new), xid_lines_reported_before=cut.reported_before)
    if cut.reported_before:
        section.findings = [_reworded(f, cut.reported_before) for f in section.findings]
    return section, cut.cursor
