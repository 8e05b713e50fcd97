"""How NVML events during the run are judged: XIDs, memory events, recovery actions.

What `dcgmi health` and the Kubernetes device plugin listen to (see
`gpucheck.faults.events`). XIDs take their verdict and action from the package's
XID table (`gpucheck.probes.xid_table`, docs/xid.md), the same words the
kernel-log findings use; the other event kinds from `EVENT_VERDICTS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.faults.verdict import RESET, Verdict, events_of, na, ok
from gpucheck.probes.xid_table import RECOVERY_ACTIONS, xid_info
from gpucheck.report import Status

# NVML event kind (gpucheck.faults.events) -> (status, action, meaning, advice).
EVENT_VERDICTS: dict[str, tuple[Status, str, str, str]] = {
    "dram_retirement": (Status.WARN, "reset-gpu", "a memory row remap or page retirement "
                        "was recorded", f"it takes effect at the next reset: {RESET}"),
    "dram_retirement_failure": (Status.FAIL, "replace-hardware", "the GPU failed to record a "
                                "row remap or page retirement", "drain the node and replace "
                                "the GPU"),
    "poison_contained": (Status.WARN, "restart-app", "a contained (non-fatal) poisoned-memory "
                         "error", "only the programs using that memory were stopped: restart "
                         f"them; {RESET} to remap the row"),
    "poison_uncontained": (Status.FAIL, "reset-gpu", "an uncontained (fatal) poisoned-memory "
                           "error", "every program on this GPU is affected: drain the node and "
                           "reset the GPU before using it again"),
    "gpu_unavailable": (Status.FAIL, "drain-node", "the GPU became unavailable",
                        "drain the node; check dmesg for Xid errors; reset or reboot"),
}
# RECOVERY_ACTIONS (NVML_GPU_RECOVERY_ACTION_*, the eventData of a recovery-action
# event -> our action) lives in xid_table: it also judges the kernel log's XID 154 lines.
# The ECC events are counted into the ECC verdicts (judge_memory); in the events table:
_ECC_WORDS = {"ecc_uncorrected": ("uncorrected ECC error", "drain-node"),
              "ecc_corrected": ("corrected ECC error", "none"),
              "ecc_corrected_storm": ("storm of corrected ECC errors", "rerun")}


def when(events: Sequence[Mapping[str, Any]]) -> str:
    """"once during the run (first 12.5 s after the watch began, in the timed loop)"."""
    first = events[0]
    where = ", in the timed loop" if any(e.get("in_timed_loop") for e in events) else ""
    times = "once" if len(events) == 1 else f"{len(events)} times"
    return f"{times} during the run (first {first.get('t_s')} s after the watch began{where})"


def judge_xids(result: Mapping[str, Any]) -> list[Verdict]:
    """Each XID seen, classified by the package's XID table; application-level ones
    (13, 31, 43, ...) are information, not a GPU fault."""
    by_xid: dict[int, list[dict[str, Any]]] = {}
    for event in events_of(result, "xid"):
        by_xid.setdefault(int(event["xid"]), []).append(event)
    verdicts = []
    for xid, seen in sorted(by_xid.items()):
        info = xid_info(xid)
        message = f"XID {xid} ({info.meaning}) {when(seen)}"
        if info.severity == "info":
            verdicts.append(ok("faults.xid", f"application-level {message}: information, "
                               "not a GPU fault"))
            continue
        status = Status.FAIL if info.severity == "fail" else Status.WARN
        verdicts.append(Verdict("faults.xid", status, message, info.action, info.advice,
                                key=str(xid)))
    return verdicts


def _recovery_verdicts(result: Mapping[str, Any]) -> list[Verdict]:
    verdicts = []
    for event in events_of(result, "gpu_recovery_action"):
        what, action = RECOVERY_ACTIONS.get(int(event["data"]), (None, "none"))
        if what is not None:
            verdicts.append(Verdict("faults.event.gpu_recovery_action", Status.FAIL,
                                    f"the driver asks for a {what} ({when([event])})", action,
                                    f"{what} before using the GPU again", key=what))
    return verdicts


def judge_events(result: Mapping[str, Any]) -> list[Verdict]:
    """XIDs and the memory/availability events; n/a when no event set could be registered."""
    if result.get("events_registered") is None:
        why = result.get("events_reason") or "not registered"
        return [na("faults.xid", f"XID/ECC events ({why})")]
    verdicts = judge_xids(result)
    for kind, (status, action, meaning, advice) in EVENT_VERDICTS.items():
        seen = events_of(result, kind)
        if seen:
            verdicts.append(Verdict(f"faults.event.{kind}", status, f"NVML event: {meaning}, "
                                    f"{when(seen)}", action, advice))
    verdicts += _recovery_verdicts(result)
    unknown = [e for e in result.get("events") or [] if str(e.get("kind")).startswith("event_")]
    if unknown:
        verdicts.append(Verdict("faults.event.unknown", Status.WARN, f"NVML events of a type "
                                f"gpucheck does not know ({unknown[0]['kind']}) {when(unknown)}",
                                "rerun", "look the event type up in nvml.h; run again"))
    if not verdicts:
        verdicts.append(ok("faults.xid", "no XID or memory event"))
    return verdicts


def meaning(event: Mapping[str, Any]) -> tuple[str, str]:
    """(what the event means, its action), for the section's events table."""
    kind = str(event.get("kind"))
    if kind == "xid":
        info = xid_info(int(event["xid"]))
        return info.meaning, info.action
    if kind in EVENT_VERDICTS:
        return EVENT_VERDICTS[kind][2], EVENT_VERDICTS[kind][1]
    if kind == "gpu_recovery_action":
        what, action = RECOVERY_ACTIONS.get(int(event["data"]), ("no action", "none"))
        return f"the driver asks for: {what}", action
    return _ECC_WORDS.get(kind, (f"unknown NVML event ({kind})", "rerun"))
