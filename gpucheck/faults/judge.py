"""Rank 0's verdicts on one rank's `FaultWatch.result()`: memory, NVML events, the
watcher's own trouble and the links, at DCGM's rates (clocks: `clocks`; docs/faults.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.checks.check import table_cause
from gpucheck.faults.counters import BER_ZERO, COUNTERS, LOST_KINDS, decode_ber
from gpucheck.probes.nvml import SLOW_ADVICE, slow_words
from gpucheck.probes.xid_table import recovery_action, xid_info
from gpucheck.report import Finding, Status, ok, skip

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
    """A pending bank remap: FAIL (a reset applies it); new bank remappings: WARN."""
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
    """The GPU stopped answering: FAIL alone; NVML slow or other watcher trouble: WARN."""
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


# -- the links ---------------------------------------------------------------------

PCIE_REPLAYS_PER_MIN = 8  # DCGM's limit ("8 replays per minute is the maximum recommended")
NVLINK_ERRORS_PER_S = 100.0  # DCGM: "CRC errors only matter at rates of 100+ per second"
SYMBOL_BER_FLOOR_EXP = 238  # DCGM_SYMBOL_BER_FLOOR_EXP_AGGREGATED (Blackwell, all links)


def judge_pcie(result: Mapping[str, Any]) -> Finding:
    """WARN above PCIE_REPLAYS_PER_MIN replays a minute (a shorter run: a minute's)."""
    check, count = "faults.pcie.replay", counter(result, "pcie_replays")
    if count is None:
        return skip(check, "PCIe replay counter")
    minutes = max(1.0, (result.get("watched_s") or 0.0) / 60.0)
    if count > PCIE_REPLAYS_PER_MIN * minutes:
        return fault(check, Status.WARN, f"{count} PCIe replays during the run "
                     f"({count / minutes:.0f} a minute; the limit is {PCIE_REPLAYS_PER_MIN})",
                     "replace-hardware", "the PCIe link kept retransmitting: at the next "
                     "maintenance reseat the GPU and check its riser, cable and slot; "
                     "replace the part if replays continue (nvidia-smi -q | grep -i replay)")
    return ok(check, f"PCIe replays +{count}")


def _links(result: Mapping[str, Any], name: str) -> str:
    grown = result.get("nvlink_links_grown") or {}
    links = sorted((int(k) for k, v in grown.items() if v.get(name)))
    return f" (link {', '.join(map(str, links))})" if links else ""


def judge_nvlink(result: Mapping[str, Any]) -> list[Finding]:
    """A link down or retrained: FAIL; CRC/replay errors at NVLINK_ERRORS_PER_S: WARN."""
    active = (counter(result, "nvlink_active_links", "before"),
              counter(result, "nvlink_active_links", "after"))
    d = {n: counter(result, f"nvlink_{n}") for n in ("crc_flit", "crc_data", "replay",
                                                      "recovery")}
    if active[0] is None or (not active[0] and not active[1]):
        return [skip("faults.nvlink.crc", "NVLink (none on this GPU)")]
    verdicts = []
    if active[1] is not None and active[1] < active[0]:
        verdicts.append(fault("faults.nvlink.down", Status.FAIL, f"{active[0] - active[1]} "
                              f"NVLink link(s) went down during the run ({active[0]} active "
                              f"before, {active[1]} after)", "reset-gpu", "check nvidia-smi "
                              "nvlink --status; reset the GPU with its NVLink peers, and "
                              "have the NVLink/NVSwitch hardware checked if a link stays down"))
    if d["recovery"]:
        verdicts.append(fault("faults.nvlink.recovery", Status.FAIL, f"{d['recovery']} "
                              f"NVLink recovery error(s) during the run"
                              f"{_links(result, 'nvlink_recovery')}: a link dropped and "
                              "retrained, stalling its traffic", "reset-gpu", "reset the GPU "
                              "with its NVLink peers (nvidia-smi nvlink -e shows the "
                              "counters); drain the node and have the link hardware checked "
                              "if it recurs"))
    verdicts.append(_nvlink_errors(result, d))
    return verdicts


def _nvlink_errors(result: Mapping[str, Any], d: dict[str, int | None]) -> Finding:
    check = "faults.nvlink.crc"
    if all(d[n] is None for n in ("crc_flit", "crc_data", "replay")):
        # Links are up, so the counters were refused: NVML removed them on Blackwell.
        return skip(check, "NVLink error counters (NVML answers NotSupported on the active "
                  "links: it removed them on Blackwell, B200/GB200, from driver R565; "
                  "NVLink faults still arrive as XIDs 144-150)")
    # A CRC error is answered by a replay: count the larger side, not both.
    errors = max((d["crc_flit"] or 0) + (d["crc_data"] or 0), d["replay"] or 0)
    seconds = result.get("watched_s") or 0.0
    rate = errors / seconds if seconds > 0 else 0.0
    where = _links(result, "nvlink_crc_flit") or _links(result, "nvlink_replay")
    if errors and rate >= NVLINK_ERRORS_PER_S:
        return fault(check, Status.WARN, f"{errors} NVLink CRC/replay errors during the run"
                     f"{where}, {rate:.0f}/s (WARN from {NVLINK_ERRORS_PER_S:.0f}/s): a "
                     "marginal link, retransmitting", "replace-hardware", "reset the GPU with "
                     "its NVLink peers; if the rate stays high, have the NVLink bridge, cable "
                     "or NVSwitch tray checked (nvidia-smi nvlink -e)")
    note = f"{where}, corrected by replay, {rate:.1f}/s" if errors else ""
    return ok(check, f"NVLink CRC/replay +{errors}{note}, recovery "
                     f"{'n/a' if d['recovery'] is None else '+' + str(d['recovery'])}")


def ber_words(raw: int | None) -> str:
    if raw is None:
        return "n/a"
    mantissa, exponent = decode_ber(raw)
    return "0" if mantissa == 0 or (mantissa, exponent) == BER_ZERO else f"{mantissa}e-{exponent}"


def effective_ber_too_high(raw: int) -> bool:
    """DCGM's IsEffectiveBerThresholdExceeded: worse than 1e-12."""
    mantissa, exponent = decode_ber(raw)
    return (mantissa, exponent) != BER_ZERO and mantissa != 0 and (
        exponent < 12 or (exponent == 12 and mantissa > 1) or (exponent == 13 and mantissa > 10))


def symbol_ber_too_high(raw: int) -> bool:
    """DCGM's IsSymbolBerThresholdExceeded (all links): worse than 15e-238."""
    mantissa, exponent = decode_ber(raw)
    return mantissa != 0 and (exponent < SYMBOL_BER_FLOOR_EXP or (
        exponent == SYMBOL_BER_FLOOR_EXP and mantissa > 15))


def judge_nvlink5(result: Mapping[str, Any]) -> list[Finding]:
    """NVLink5 counters over all links: a recovery event FAILs (as DCGM's), errors WARN."""
    names = [n for n in COUNTERS if n.startswith("nvlink5_")]
    if all(counter(result, n, "after") is None for n in names):
        return [skip("faults.nvlink5", "NVLink5 counters (link recovery, effective and symbol "
                   "errors, BER, FEC history): NVML answers NotSupported for each; only "
                   "NVLink5 GPUs (B200, GB200 and later) have them")]
    verdicts = []
    recoveries = counter(result, "nvlink5_recovery_events")
    if recoveries:
        verdicts.append(fault("faults.nvlink5.recovery", Status.FAIL, f"{recoveries} NVLink "
                              "link recovery event(s) during the run: a link left the up "
                              "state and retrained, stalling its traffic", "reset-gpu",
                              "reset the GPU with its NVLink peers (nvidia-smi nvlink -e); "
                              "drain the node and have the link hardware checked if it "
                              "recurs"))
    return verdicts + _nvlink5_errors(result)


def _nvlink5_errors(result: Mapping[str, Any]) -> list[Finding]:
    """A BER over DCGM's threshold condemns the links; effective errors alone (a
    deprecated field) ask for the diagnostics first, never for a part."""
    effective = counter(result, "nvlink5_effective_errors")
    ber: list[str] = []
    raw = counter(result, "nvlink5_effective_ber", "after")
    if raw is not None and effective_ber_too_high(raw):
        ber.append(f"effective BER {ber_words(raw)} (over 1e-12)")
    raw = counter(result, "nvlink5_symbol_ber", "after")
    if raw is not None and symbol_ber_too_high(raw):
        ber.append(f"symbol BER {ber_words(raw)} (DCGM: none expected past the FEC)")
    said = "; ".join(([f"{effective} effective (post-FEC) error(s) during the run"]
                      if effective else []) + ber)
    if ber:
        return [fault("faults.nvlink5.errors", Status.WARN, f"NVLink5: {said}",
                      "replace-hardware", "the links carry errors the FEC did not "
                      "correct: run the field diagnostics (dcgmi diag -r 3), then have "
                      "the NVLink cable, tray or switch checked (nvidia-smi nvlink -e)")]
    if effective:
        return [fault("faults.nvlink5.errors", Status.WARN, f"NVLink5: {said}, BERs "
                      "within DCGM's thresholds (the count is a deprecated NVML field)",
                      "rerun", "run the field diagnostics (dcgmi diag -r 3) and look "
                      "again; a BER over its threshold is what condemns a link")]
    symbol = counter(result, "nvlink5_symbol_errors")
    # Bin b: codewords with b symbols corrected; bin 0 (nothing corrected) is not summed.
    fec = [counter(result, f"nvlink5_fec_history_{b}") for b in range(1, 16)]
    corrected = sum(v for v in fec if v) if any(v is not None for v in fec) else None
    return [ok("faults.nvlink5.errors", f"NVLink5 effective errors +{effective or 0}, "
            f"symbol errors {'n/a' if symbol is None else f'+{symbol}'} (FEC-corrected "
            f"{'n/a' if corrected is None else f'+{corrected}'}), effective BER "
            f"{ber_words(counter(result, 'nvlink5_effective_ber', 'after'))}, symbol BER "
            f"{ber_words(counter(result, 'nvlink5_symbol_ber', 'after'))}")]


def judge_links(result: Mapping[str, Any]) -> list[Finding]:
    return [judge_pcie(result), *judge_nvlink(result), *judge_nvlink5(result)]
