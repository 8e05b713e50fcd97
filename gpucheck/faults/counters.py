"""What the watcher reads of one GPU: its error counters before and after a load (None
where the GPU or driver lacks one: n/a), and its NVML event set, polled with a 0 ms wait
so it never holds the doorway (docs/faults.md names nvidia-smi's word for each)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from gpucheck.probes.gpu_read import ALL_LINKS, BANK_FIELDS
from gpucheck.probes.nvml import NvmlDoor, NvmlFailure, read_fields

# Failures that mean the GPU (or the driver) stopped answering: a fault, never n/a.
LOST_KINDS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "Timeout")
# NVLink5 (Blackwell) counters, summed over the links (scopeId ALL_LINKS, as DCGM reads
# them); every GPU before Blackwell answers NotSupported for each (n/a).
NVLINK5_FIELDS: dict[str, tuple[str, int]] = {
    "nvlink5_recovery_events": ("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS", ALL_LINKS),
    "nvlink5_effective_errors": ("NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", ALL_LINKS),
    "nvlink5_effective_ber": ("NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER", ALL_LINKS),
    "nvlink5_symbol_errors": ("NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS", ALL_LINKS),
    "nvlink5_symbol_ber": ("NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER", ALL_LINKS),
    **{f"nvlink5_fec_history_{b}": (f"NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_{b}", ALL_LINKS)
       for b in range(16)},
}
# Our counter -> the pynvml constant of nvmlDeviceGetNvLinkErrorCounter's `counter`.
NVLINK_ERRORS: dict[str, str] = {
    "nvlink_crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "nvlink_crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "nvlink_replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "nvlink_recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
}
# Every counter the result carries, in its order (docs/faults.md says what nvidia-smi
# calls each).
COUNTERS = ("ecc_uncorrected", "ecc_corrected", "remapped_rows_pending",
            "remapped_rows_failed", "remapped_rows_uncorrected", "remapped_rows_corrected",
            "retired_pages_dbe", "retired_pages_sbe", "retired_pages_pending", "pcie_replays",
            "nvlink_active_links", *NVLINK_ERRORS, "bank_remaps_active",
            "bank_remaps_inactive", "bank_remap_pending", *NVLINK5_FIELDS)
# Fallbacks are nvml.h's values, for a pynvml too old to name them.
_NVLINK_DEFAULTS = {"NVML_NVLINK_ERROR_DL_REPLAY": 0, "NVML_NVLINK_ERROR_DL_RECOVERY": 1,
                    "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2, "NVML_NVLINK_ERROR_DL_CRC_DATA": 3}


@dataclass(frozen=True)
class Snapshot:
    """The counters at one moment; `per_link` keeps each active link's NVLink errors."""

    values: dict[str, int | None]
    links: tuple[int, ...] | None  # the active NVLinks; None: no NVLink (n/a)
    per_link: dict[int, dict[str, int]] = field(default_factory=dict)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


BER_ZERO = (15, 255)  # the packed (mantissa, exponent) NVML gives for a BER of zero (DCGM)


def decode_ber(raw: int) -> tuple[int, int]:
    """NVML's packed BER (NVML_FI_DEV_NVLINK_COUNT_*_BER): (mantissa, exponent), the BER
    being mantissa x 10^-exponent (nvml.h NVML_NVLINK_ERROR_COUNTER_BER_GET: mantissa
    bits 8-11, exponent bits 0-7; BER_ZERO encodes zero, as DCGM reads it)."""
    return (raw >> 8) & 0xF, raw & 0xFF


def ber_value(raw: int) -> float:
    mantissa, exponent = decode_ber(raw)
    return 0.0 if (mantissa, exponent) == BER_ZERO else mantissa * 10.0 ** -exponent


def _nvlink5_per_link(nvml: NvmlDoor, handle: Any,
                      links: tuple[int, ...]) -> dict[str, int | None]:
    """Where the driver answers the NVLink5 counters per link only (scopeId = link, as
    NVRx's NVLinkWindowHealthCheck reads them): counts summed over `links`, and the
    worst link's BER. One nvmlDeviceGetFieldValues call."""
    wanted = {(name, link): (constant, link)
              for name, (constant, _) in NVLINK5_FIELDS.items() for link in links}
    found = read_fields(nvml, handle, wanted)
    out: dict[str, int | None] = dict.fromkeys(NVLINK5_FIELDS)
    for (name, _link), value in found.items():
        if value is None:
            continue
        now = out[name]
        if name.endswith("_ber"):
            out[name] = int(value) if now is None or ber_value(int(value)) > ber_value(now) \
                else now
        else:
            out[name] = (now or 0) + int(value)
    return out


def active_links(nvml: NvmlDoor, handle: Any) -> tuple[int, ...] | None:
    """The NVLinks that are up (`nvidia-smi nvlink --status`); None without NVLink. NVML
    errs for link numbers past the GPU's last, so the scan stops at the first."""
    links: list[int] = []
    for link in range(getattr(nvml.module, "NVML_NVLINK_MAX_LINKS", 18)):
        state = nvml.get("nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            return None if link == 0 else tuple(links)
        if state:
            links.append(link)
    return tuple(links)


PerLink = dict[int, dict[str, int]]  # link -> NVLink error counter -> count


def _nvlink_errors(nvml: NvmlDoor, handle: Any,
                   links: tuple[int, ...]) -> tuple[dict[str, int | None], PerLink]:
    """Each error counter summed over `links`; None when no link has it."""
    m = nvml.module
    totals: dict[str, int | None] = dict.fromkeys(NVLINK_ERRORS)
    per_link: PerLink = {}
    for link in links:
        for name, constant in NVLINK_ERRORS.items():
            counter = getattr(m, constant, _NVLINK_DEFAULTS[constant])
            value = nvml.get("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
            if value is None:
                continue
            totals[name] = (totals[name] or 0) + int(value)
            per_link.setdefault(link, {})[name] = int(value)
    return totals, per_link


def read_snapshot(nvml: NvmlDoor, handle: Any,
                  error_links: tuple[int, ...] | None = None) -> Snapshot:
    """All counters now. NVLink errors are read on `error_links` (after the run: the
    links that were active before it, so a link that went down is still read), or
    on the links active now when None."""
    m = nvml.module
    volatile = getattr(m, "NVML_VOLATILE_ECC", 0)  # since the driver loaded
    values: dict[str, int | None] = {
        name: nvml.get("nvmlDeviceGetTotalEccErrors", handle, getattr(m, kind, default),
                       volatile)
        for name, kind, default in (
            ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            ("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0))}
    rows = nvml.get("nvmlDeviceGetRemappedRows", handle)  # Ampere and newer
    values.update(zip(("remapped_rows_corrected", "remapped_rows_uncorrected"),
                      (None, None) if rows is None else (int(rows[0]), int(rows[1])),
                      strict=True))
    values["remapped_rows_pending"] = None if rows is None else _flag(rows[2])
    values["remapped_rows_failed"] = None if rows is None else _flag(rows[3])
    # Page retirement: before Ampere (newer GPUs remap rows instead).
    for name, cause, default in (
            ("retired_pages_sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
            ("retired_pages_dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
        pages = nvml.get("nvmlDeviceGetRetiredPages", handle, getattr(m, cause, default))
        values[name] = None if pages is None else len(pages)
    values["retired_pages_pending"] = _flag(
        nvml.get("nvmlDeviceGetRetiredPagesPendingStatus", handle))
    # The bank remapper and the NVLink5 counters: one nvmlDeviceGetFieldValues call.
    fields = read_fields(nvml, handle, {**BANK_FIELDS, **NVLINK5_FIELDS})
    values.update((k, None if v is None else int(v)) for k, v in fields.items())
    replays = nvml.get("nvmlDeviceGetPcieReplayCounter", handle)
    values["pcie_replays"] = None if replays is None else int(replays)
    now_active = active_links(nvml, handle)
    values["nvlink_active_links"] = None if now_active is None else len(now_active)
    links = now_active if error_links is None else error_links
    per_link: PerLink = {}
    values.update(dict.fromkeys(NVLINK_ERRORS))
    if links:
        errors, per_link = _nvlink_errors(nvml, handle, links)
        values.update(errors)
        if all(values[name] is None for name in NVLINK5_FIELDS):
            values.update(_nvlink5_per_link(nvml, handle, links))
    return Snapshot(values, links, per_link)


def delta(before: int | None, after: int | None) -> int | None:
    """after - before; None (n/a) when either side is n/a."""
    return None if before is None or after is None else after - before


def counter_rows(before: Snapshot | None,
                 after: Snapshot | None) -> dict[str, dict[str, int | None]]:
    """{counter: {"before", "after", "delta"}} for the result dict (None = n/a)."""
    rows = {}
    for name in COUNTERS:
        b = None if before is None else before.values.get(name)
        a = None if after is None else after.values.get(name)
        rows[name] = {"before": b, "after": a, "delta": delta(b, a)}
    return rows


def link_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, dict[str, int]]:
    """Per link, the NVLink error counters that grew ({"7": {"nvlink_crc_flit": 12}})."""
    if before is None or after is None:
        return {}
    grown: dict[str, dict[str, int]] = {}
    for link, values in after.per_link.items():
        for name, value in values.items():
            change = delta(before.per_link.get(link, {}).get(name), value)
            if change:
                grown.setdefault(str(link), {})[name] = change
    return grown


# -- NVML events ------------------------------------------------------------------

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

    def open(self) -> None:
        """Create the set and register each supported kind; n/a (with `reason`) when
        the driver has no events for this GPU (containers often answer NotSupported)."""
        m = self._nvml.module
        supported: int | None = self._nvml.get("nvmlDeviceGetSupportedEventTypes",
                                               self._handle)
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
