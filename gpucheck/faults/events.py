"""NVML events during the run: XID critical errors and ECC / memory events.

What DCGM's XID watch (`dcgmi health`) and the Kubernetes device plugin listen
to: an event set (`nvmlEventSetCreate`), registered on this GPU for the types it
supports (`nvmlDeviceGetSupportedEventTypes`, `nvmlDeviceRegisterEvents`), drained
with `nvmlEventSetWait_v2` and freed (`nvmlEventSetFree`). The same XIDs land in
the kernel log (`dmesg | grep Xid`), which `gpucheck env` reads; the event set
ties them to this run and this rank.

Polling, not blocking: the driver queues events in the set, so a wait with a 0 ms
timeout on the watcher's tick returns every event queued since the last tick and
never holds the doorway (which serialises all NVML calls on one worker thread: a
blocking 200 ms wait would delay every other NVML call, mark_start's included, by
up to 200 ms). The cost is that an event's time is known to one tick (`sample_s`).
NVMLError_Timeout from the wait is the normal "no event".
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gpucheck.faults.counters import LOST_KINDS
from gpucheck.probes.gpu_read import NvmlDoor
from gpucheck.probes.nvml import NvmlFailure

MAX_EVENTS_PER_POLL = 64  # a storm cannot keep one tick busy for long


@dataclass(frozen=True)
class EventKind:
    """One NVML event type the watcher listens to."""

    constant: str  # the pynvml name of its bit (nvmlEventType...)
    name: str  # the word the result and the report use


WATCHED: tuple[EventKind, ...] = (
    EventKind("nvmlEventTypeXidCriticalError", "xid"),
    EventKind("nvmlEventTypeDoubleBitEccError", "ecc_uncorrected"),
    EventKind("nvmlEventTypeSingleBitEccError", "ecc_corrected"),
    EventKind("nvmlEventTypeSingleBitEccErrorStorm", "ecc_corrected_storm"),
    EventKind("nvmlEventTypeDramRetirementEvent", "dram_retirement"),
    EventKind("nvmlEventTypeDramRetirementFailure", "dram_retirement_failure"),
    EventKind("nvmlEventTypeNonFatalPoisonError", "poison_contained"),
    EventKind("nvmlEventTypeFatalPoisonError", "poison_uncontained"),
    EventKind("nvmlEventTypeGpuUnavailableError", "gpu_unavailable"),
    EventKind("nvmlEventTypeGpuRecoveryAction", "gpu_recovery_action"),
)


class EventWatch:
    """One GPU's event set. `open` registers, `poll` drains, `close` frees."""

    def __init__(self, nvml: NvmlDoor, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self._set: Any = None
        self._bits: dict[int, str] = {}
        self.reason: str | None = None  # why events are n/a

    @property
    def registered(self) -> list[str] | None:
        """The event kinds registered; None when events are n/a here."""
        return sorted(self._bits.values()) if self._bits else None

    def _supported(self) -> int | None:
        mask: int | None = self._nvml.get("nvmlDeviceGetSupportedEventTypes", self._handle)
        return mask

    def open(self) -> None:
        """Create the set and register each supported kind; n/a (with `reason`) when
        the driver has no events for this GPU (containers often answer NotSupported)."""
        m = self._nvml.module
        supported = self._supported()
        wanted = {getattr(m, k.constant): k.name for k in WATCHED if hasattr(m, k.constant)}
        if supported is not None:
            wanted = {bit: name for bit, name in wanted.items() if bit & supported}
        if not wanted:
            self.reason = "this GPU supports none of the watched NVML event types"
            return
        event_set = self._nvml.get("nvmlEventSetCreate")
        if event_set is None:
            self.reason = "NVML event sets are not available here"
            return
        self._set = event_set  # from here on `close` frees it, whatever happens
        for bit, name in wanted.items():
            if self._register(bit, event_set):
                self._bits[bit] = name
        if not self._bits:
            self.reason = "the driver refused to register XID/ECC events for this GPU"
            self.close()

    def _register(self, bit: int, event_set: Any) -> bool:
        try:
            self._nvml.call("nvmlDeviceRegisterEvents", self._handle, bit, event_set)
        except NvmlFailure as exc:
            if exc.kind in LOST_KINDS:
                raise
            return False  # one kind refused: keep the others
        return True

    def poll(self) -> list[tuple[str, int]]:
        """Every queued event as (kind, eventData); XID events carry the XID number."""
        events: list[tuple[str, int]] = []
        while self._set is not None and len(events) < MAX_EVENTS_PER_POLL:
            try:
                data = self._nvml.call("nvmlEventSetWait_v2", self._set, 0)
            except NvmlFailure as exc:
                if exc.kind == "NVMLError_Timeout":  # nothing queued: the normal answer
                    break
                raise
            events.extend(self._kinds(int(data.eventType), int(data.eventData)))
        return events

    def _kinds(self, event_type: int, data: int) -> list[tuple[str, int]]:
        named = [(name, data) for bit, name in self._bits.items() if event_type & bit]
        return named or [(f"event_type_0x{event_type:x}", data)]

    def close(self) -> None:
        """Free the set (best effort: a lost GPU must not stop the watcher's exit)."""
        if self._set is not None:
            event_set, self._set = self._set, None
            with contextlib.suppress(NvmlFailure):
                self._nvml.call("nvmlEventSetFree", event_set)
