"""What every judge of a `FaultWatch.result()` shares: the `Verdict` and the readers.

Each kind of fault is judged in its own short module, on one rank's result dict:
- `judge_memory`: ECC, row remapping, page retirement;
- `judge_links`: PCIe replays, NVLink (down, recovery, CRC/replay);
- `judge_events`: XIDs and the other NVML events;
- `judge_clocks`: clock-event reasons (slowdowns) in the timed window;
- `judge_watch`: the watcher itself (a GPU lost, NVML slow, watcher trouble).
`gpucheck.faults.findings` runs them all, merges the ranks that shared a GPU and
builds the section. Every WARN/FAIL verdict carries its action (one of
`xid_table.ACTIONS`), which its finding carries as the cause "table.<action>".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.probes.xid_table import ACTIONS
from gpucheck.report import Status

# The advice every "takes effect at the next reset" verdict gives.
RESET = "reset the GPU (nvidia-smi -r -i <index>) when it is idle, or reboot the node"


@dataclass(frozen=True)
class Verdict:
    """One judgement of one rank's result, before ranks sharing a GPU are merged."""

    check: str
    status: Status
    message: str
    action: str = "none"
    advice: str = ""
    key: str = ""  # tells apart several verdicts of one check (one per XID)

    def __post_init__(self) -> None:
        assert self.action in ACTIONS, self.action


def ok(check: str, message: str) -> Verdict:
    return Verdict(check, Status.OK, message)


def na(check: str, message: str) -> Verdict:
    """n/a: the GPU or driver lacks what this check reads (never a fault)."""
    return Verdict(check, Status.SKIP, message)


def counter(result: Mapping[str, Any], name: str, which: str = "delta") -> int | None:
    """A counter's "before", "after" or "delta" (None: n/a)."""
    return ((result.get("counters") or {}).get(name) or {}).get(which)


def events_of(result: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in result.get("events") or [] if e.get("kind") == kind]


def registered(result: Mapping[str, Any], kind: str) -> bool:
    """Whether the event set listened to `kind` (so its absence means none happened)."""
    return kind in (result.get("events_registered") or [])


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def rank_of(result: Mapping[str, Any], position: int) -> int:
    """The result's rank; its position in the gathered list when it has none."""
    rank = result.get("rank")
    return position if rank is None else int(rank)
