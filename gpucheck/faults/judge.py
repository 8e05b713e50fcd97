"""Rank 0's verdicts on one rank's `FaultWatch.result()`: memory, NVML events and the
watcher's own trouble (links: `links`, clocks: `clocks`; thresholds in docs/faults.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.checks.check import table_cause
from gpucheck.faults.counters import LOST_KINDS
from gpucheck.probes.nvml import SLOW_ADVICE, slow_words
from gpucheck.probes.xid_table import recovery_action, xid_info
from gpucheck.report import Finding, Status, ok, skip

# The advice every "takes effect at the next reset" verdict gives.
RESET = "reset the GPU (nvidia-smi -r -i <index>) when it is idle, or reboot the node"


def fault(check: str, status: Status, message: str, action: str, advice: str) -> Finding:
    """A WARN or FAIL whose action the verdict names (cause "table.<action>")."""
    return Finding(check, status, message, advice, cause=table_cause(action))


def counter(result: Mapping[str, Any], name: str, which: str = "delta") -> int | None:
    """A counter's "before", "after" or "delta" (None: n/a)."""
    return ((result.get("counters") or {}).get(name) or {}).get(which)


def events_of(result: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in result.get("events") or [] if e.get("kind") == kind]


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


CORRECTED_ECC_WARN = 10  # corrected errors in one run that make a WARN


def judge_uncorrected_ecc(result: Mapping[str, Any]) -> Finding:
    check, count = "faults.ecc.uncorrected", counter(result, "ecc_uncorrected")
    events = len(events_of(result, "ecc_uncorrected"))
    if count is None and "ecc_uncorrected" not in (result.get("events_registered") or []):
        return skip(check, "uncorrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new:
        errors = plural(new, "new uncorrected (double-bit) ECC error")
        return fault(check, Status.FAIL, f"{errors} during the run", "drain-node",
                     "the GPU's memory returned data it could not correct: drain the node, "
                     "reset the GPU (nvidia-smi -r -i <index>) so the row is remapped or the "
                     "page retired, and replace the GPU if errors return")
    return ok(check, "uncorrected ECC +0")


def judge_corrected_ecc(result: Mapping[str, Any]) -> Finding:
    """WARN from CORRECTED_ECC_WARN corrected errors on, or a storm of them."""
    check, count = "faults.ecc.corrected", counter(result, "ecc_corrected")
    events = len(events_of(result, "ecc_corrected"))
    advice = ("ECC corrected them and no data was lost; run again and watch nvidia-smi -q -d "
              "ECC: a count that keeps growing means failing memory (replace the GPU)")
    if events_of(result, "ecc_corrected_storm"):
        return fault(check, Status.WARN, "the driver reported a storm of corrected "
                     "(single-bit) ECC errors during the run", "rerun", advice)
    if count is None and "ecc_corrected" not in (result.get("events_registered") or []):
        return skip(check, "corrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new >= CORRECTED_ECC_WARN:
        return fault(check, Status.WARN, f"{new} corrected (single-bit) ECC errors during "
                     f"the run (WARN from {CORRECTED_ECC_WARN})", "rerun", advice)
    note = " (corrected, no data lost; normal in small numbers)" if new else ""
    return ok(check, f"corrected ECC +{new}{note}")


def judge_remapped_rows(result: Mapping[str, Any]) -> list[Finding]:
    """Row remapper (Ampere+): pending = reset needed (FAIL), failed = replace (FAIL)."""
    pending = (counter(result, "remapped_rows_pending", "before"),
               counter(result, "remapped_rows_pending", "after"))
    failed = (counter(result, "remapped_rows_failed", "before"),
              counter(result, "remapped_rows_failed", "after"))
    if pending[1] is None and failed[1] is None:
        return [skip("faults.remapped_rows.pending", "row remapping (not on this GPU)")]
    verdicts = []
    if failed[1]:
        when = "had already failed before the run" if failed[0] else "failed during the run"
        verdicts.append(fault("faults.remapped_rows.failed", Status.FAIL, f"a memory row "
                              f"remap {when}: the GPU could not replace a bad row",
                              "replace-hardware", "drain the node and replace the GPU"))
    if pending[1]:
        when = ("was already pending before the run (not caused by it)" if pending[0]
                else "became pending during the run")
        verdicts.append(fault("faults.remapped_rows.pending", Status.FAIL, f"a memory row "
                              f"remap {when}: a bad row waits for a GPU reset", "reset-gpu",
                              f"{RESET}; until then the bad row can fail again"))
    return verdicts or [ok("faults.remapped_rows.pending", "no row remap pending or failed")]


def judge_retired_pages(result: Mapping[str, Any]) -> Finding:
    """Page retirement (before Ampere): DBE-retired or pending pages FAIL, SBE ones WARN."""
    check = "faults.retired_pages"
    dbe, sbe = counter(result, "retired_pages_dbe"), counter(result, "retired_pages_sbe")
    pending = counter(result, "retired_pages_pending", "after")
    if dbe is None and sbe is None and pending is None:
        return skip(check, "page retirement (newer GPUs remap rows instead)")
    advice = f"the retirement takes effect at the next reset: {RESET}"
    if dbe:
        return fault(check, Status.FAIL, f"{plural(dbe, 'page')} retired for double-bit "
                     "ECC errors during the run", "reset-gpu", advice)
    if sbe:
        return fault(check, Status.WARN, f"{plural(sbe, 'page')} retired for repeated "
                     "single-bit ECC errors during the run", "reset-gpu", advice)
    if pending:
        return fault(check, Status.FAIL, "a page retirement is pending (since before the "
                     "run)", "reset-gpu", advice)
    return ok(check, "retired pages +0")


def judge_bank_remaps(result: Mapping[str, Any]) -> list[Finding]:
    """A pending bank remap: FAIL (a reset applies it); new bank remappings: WARN;
    nothing where the GPU lacks the remapper."""
    pending = (counter(result, "bank_remap_pending", "before"),
               counter(result, "bank_remap_pending", "after"))
    grown = {k: counter(result, f"bank_remaps_{k}") for k in ("active", "inactive")}
    if pending[1] is None and all(v is None for v in grown.values()):
        return []
    if pending[1]:
        when = ("was already pending before the run (not caused by it)" if pending[0]
                else "became pending during the run")
        return [fault("faults.bank_remap.pending", Status.FAIL, f"a memory bank remap "
                      f"{when}: it waits for a GPU reset", "reset-gpu", RESET)]
    new = sum(v for v in grown.values() if v and v > 0)
    if new:
        return [fault("faults.bank_remaps", Status.WARN, f"{plural(new, 'new bank remapping')}"
                      f" during the run ({grown['active'] or 0} active, "
                      f"{grown['inactive'] or 0} inactive): the memory replaced a bank "
                      "under this load", "rerun", "run again and watch nvidia-smi -q -d "
                      "ROW_REMAPPER: remappings that keep growing mean failing memory "
                      "(replace the GPU)")]
    return [ok("faults.bank_remaps", "bank remappings +0, none pending")]


def judge_memory(result: Mapping[str, Any]) -> list[Finding]:
    return [judge_uncorrected_ecc(result), judge_corrected_ecc(result),
            *judge_remapped_rows(result), *judge_bank_remaps(result),
            judge_retired_pages(result)]


# NVML event kind (gpucheck.faults.counters.WATCHED) -> (status, action, meaning, advice).
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
# The ECC events count into the ECC verdicts; in the events table:
_ECC_WORDS = {"ecc_uncorrected": ("uncorrected ECC error", "drain-node"),
              "ecc_corrected": ("corrected ECC error", "none"),
              "ecc_corrected_storm": ("storm of corrected ECC errors", "rerun")}


def when(events: Sequence[Mapping[str, Any]]) -> str:
    """"once during the run (first 12.5 s after the watch began, in the timed loop)"."""
    first = events[0]
    where = ", in the timed loop" if any(e.get("in_timed_loop") for e in events) else ""
    times = "once" if len(events) == 1 else f"{len(events)} times"
    return f"{times} during the run (first {first.get('t_s')} s after the watch began{where})"


def judge_xids(result: Mapping[str, Any]) -> list[Finding]:
    """Each XID by the XID table; application-level ones (13, 31, ...) are an OK."""
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
        verdicts.append(fault("faults.xid", status, message, info.action, info.advice))
    return verdicts


def judge_events(result: Mapping[str, Any]) -> list[Finding]:
    """XIDs and the memory/availability events; n/a when no event set could be registered."""
    if result.get("events_registered") is None:
        why = result.get("events_reason") or "not registered"
        return [skip("faults.xid", f"XID/ECC events ({why})")]
    verdicts = judge_xids(result)
    for kind, (status, action, meaning, advice) in EVENT_VERDICTS.items():
        seen = events_of(result, kind)
        if seen:
            verdicts.append(fault(f"faults.event.{kind}", status, f"NVML event: {meaning}, "
                                  f"{when(seen)}", action, advice))
    for event in events_of(result, "gpu_recovery_action"):
        what, action = recovery_action(int(event["data"])) or (None, "none")
        if what is not None:
            verdicts.append(fault("faults.event.gpu_recovery_action", Status.FAIL,
                                  f"the driver asks for a {what} ({when([event])})", action,
                                  f"{what} before using the GPU again"))
    unknown = [e for e in result.get("events") or [] if str(e.get("kind")).startswith("event_")]
    if unknown:
        verdicts.append(fault("faults.event.unknown", Status.WARN, f"NVML events of a type "
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
        what, action = recovery_action(int(event["data"])) or ("no action", "none")
        return f"the driver asks for: {what}", action
    return _ECC_WORDS.get(kind, (f"unknown NVML event ({kind})", "rerun"))


# What each way of being lost means, and its action.
_LOST: dict[str, tuple[str, str, str]] = {
    "NVMLError_GpuIsLost": ("NVML says the GPU is lost (fell off the bus or became "
                            "inaccessible)", "drain-node", "check dmesg for Xid 79 ('fallen "
                            "off the bus'); a reset in place rarely works: reboot or "
                            "power-cycle the node, and replace the GPU if it happens again"),
    "NVMLError_ResetRequired": ("NVML says the GPU needs a reset before it can be used "
                                "again", "reset-gpu", "reset the GPU (nvidia-smi -r -i "
                                "<index>) when it is idle, or reboot the node"),
    "Timeout": ("an NVML call never came back, within its budget nor a second, longer one",
                "drain-node", "the driver is wedged on this GPU and jobs would hang too: "
                "check dmesg for Xid errors; reboot the node (a GPU reset rarely frees a "
                "wedged driver); replace the GPU if it happens again"),
}


def judge_errors(result: Mapping[str, Any]) -> list[Finding]:
    """The GPU stopped answering: FAIL alone; NVML slow or other watcher trouble: WARN
    (what was read before it is still judged)."""
    lost = [e for e in result.get("errors") or [] if e.get("kind") in LOST_KINDS]
    if lost:
        words, action, advice = _LOST.get(lost[0].get("kind"), _LOST["Timeout"])
        return [fault("faults.gpu_lost", Status.FAIL, f"{words}, {lost[0]['phase']} "
                      f"({lost[0]['message']})", action, advice)]
    calls = [(c["function"], float(c["waited_s"]), float(c["budget_s"]))
             for c in result.get("nvml_slow") or []]
    slow = [fault("faults.nvml_slow", Status.WARN, f"NVML slow, not lost: {slow_words(calls)}",
                  "none", SLOW_ADVICE)] if calls else []
    return [*slow, *(fault("faults.watch", Status.WARN, f"the fault watcher ran into trouble "
                           f"{e['phase']} ({e['message']}); what it could not read is n/a",
                           "rerun", "run again; report a gpucheck bug if it repeats")
                     for e in result.get("errors") or [])]
