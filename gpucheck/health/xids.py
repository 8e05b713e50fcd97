"""Xid lines since the last check: the kernel log read by `gpucheck.probes.kernel_log`,
judged by `xid_table.judge_xid`, less what an earlier check already reported.

Without a state dir every Xid of this boot is raised (as `gpucheck env` does); with
one, each consumer's cursor says where it stopped reading: how many Xid lines it had
read, a hash chained over all of them, and the fingerprints of the last TAIL_LINES.
Only the lines after the cursor are raised. (A fault that needs a reset or a reboot
stays reported after that by `gpucheck.health.faults`, not by raising its line again.)
- the log grew: its first `count` lines still hash to `chain`: the rest are new, so two
  identical lines after a first one (stamped to the second, or unstamped) are two new
  events, never taken for the one already read;
- the kernel ring buffer wrapped, or kern.log was rotated (the chain no longer holds):
  logs lose their oldest lines first, so the remembered tail is found at the earliest
  place it fits, and what follows is new (when lines are so alike that two places fit,
  the earliest raises a line twice rather than lose one); a tail not found at all was
  rotated away: every line is new;
- a reboot (another boot id): the log is another boot's, every line in it is new.
A line is its fingerprint: GPU, XID, timestamp and the driver's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.kernel_log import KernelLog, XidEvent
from gpucheck.probes.xid_section import XidFault, kernel_log_part
from gpucheck.report import Section

TAIL_LINES = 32


def fingerprint(event: XidEvent) -> str:
    import hashlib  # only when there are Xid lines: loading OpenSSL costs every run ~10 ms

    text = "|".join(str(v) for v in (event.bus_id, event.xid, event.time, event.detail,
                                     event.off_bus_line, event.instance))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:24]


def _chain(prints: Sequence[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(prints).encode("ascii")).hexdigest()[:24]


@dataclass(frozen=True)
class XidCut:
    """The events not reported before, how many were, and the cursor to remember."""

    new: tuple[XidEvent, ...]
    reported_before: int
    cursor: dict[str, Any]


def _tail_end(prints: Sequence[str], tail: Sequence[str]) -> int:
    """Where the remembered tail ends in a log that lost its oldest lines: the earliest
    end it fits (the log's first lines may be the tail's last ones), 0 where none."""
    for end in range(1, len(prints) + 1):
        size = min(end, len(tail))
        if list(prints[end - size:end]) == list(tail[len(tail) - size:]):
            return end
    return 0


def start_of_new(prints: Sequence[str], cursor: dict[str, Any]) -> int:
    """How many of the log's Xid lines the cursor had read (see the module doc)."""
    count, chain, tail = cursor.get("count"), cursor.get("chain"), cursor.get("tail") or []
    if isinstance(count, int) and 0 < count <= len(prints) and chain == _chain(prints[:count]):
        return count
    return _tail_end(prints, tail) if tail else 0


def cursor_of(log: KernelLog) -> dict[str, Any]:
    """Where a reader of all of `log` stands (also what `--set-healthy` clears up to)."""
    prints = [fingerprint(e) for e in log.events]
    return {"count": len(prints), "chain": _chain(prints) if prints else None,
            "tail": prints[-TAIL_LINES:], "source": log.source}


def cut_reported(log: KernelLog, cursor: dict[str, Any], same_boot: bool) -> XidCut:
    """Split the log's events where this consumer stopped reading (see above)."""
    events = list(log.events)
    prints = [fingerprint(e) for e in events]
    start = start_of_new(prints, cursor) if same_boot else 0
    return XidCut(tuple(events[start:]), start, cursor_of(log))


@dataclass(frozen=True)
class XidPart:
    """The kernel-log section of the new lines, its GPU faults (each with its bus id
    and XID, for `gpucheck.health.faults`), and the cursor to remember."""

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
    cut = cut_reported(log, cursor, same_boot)
    section, faults = kernel_log_part(replace(log, events=cut.new), gpus,
                                      reported_before=cut.reported_before)
    section.data.update(xid_lines_new=len(cut.new), xid_lines_reported_before=cut.reported_before)
    return XidPart(section, cut.cursor, tuple(faults))
