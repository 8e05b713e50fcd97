"""How the GPU's memory is judged: ECC, row remapping, page retirement.

`nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT` before and after the run. Only
what changed during the run is a fault, except a pending or failed row remap (or a
pending page retirement), which needs the same action whenever it happened.
docs/faults.md says why each threshold is where it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.faults.verdict import (
    RESET,
    Verdict,
    counter,
    events_of,
    na,
    ok,
    plural,
    registered,
)
from gpucheck.report import Status

CORRECTED_ECC_WARN = 10  # corrected errors in one run that make a WARN


def judge_uncorrected_ecc(result: Mapping[str, Any]) -> Verdict:
    """Any new uncorrected (double-bit) ECC error: FAIL, drain the node."""
    check, count = "faults.ecc.uncorrected", counter(result, "ecc_uncorrected")
    events = len(events_of(result, "ecc_uncorrected"))
    if count is None and not registered(result, "ecc_uncorrected"):
        return na(check, "uncorrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new:
        errors = plural(new, "new uncorrected (double-bit) ECC error")
        return Verdict(check, Status.FAIL, f"{errors} during the run", "drain-node",
                       "the GPU's memory returned data it could not correct: drain the node, "
                       "reset the GPU (nvidia-smi -r -i <index>) so the row is remapped or the "
                       "page retired, and replace the GPU if errors return")
    return ok(check, "uncorrected ECC +0")


def judge_corrected_ecc(result: Mapping[str, Any]) -> Verdict:
    """Corrected errors are normal in small numbers: WARN from CORRECTED_ECC_WARN on,
    or when the driver reports a storm of them."""
    check, count = "faults.ecc.corrected", counter(result, "ecc_corrected")
    events = len(events_of(result, "ecc_corrected"))
    advice = ("ECC corrected them and no data was lost; run again and watch nvidia-smi -q -d "
              "ECC: a count that keeps growing means failing memory (replace the GPU)")
    if events_of(result, "ecc_corrected_storm"):
        return Verdict(check, Status.WARN, "the driver reported a storm of corrected "
                       "(single-bit) ECC errors during the run", "rerun", advice)
    if count is None and not registered(result, "ecc_corrected"):
        return na(check, "corrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new >= CORRECTED_ECC_WARN:
        return Verdict(check, Status.WARN, f"{new} corrected (single-bit) ECC errors during "
                       f"the run (WARN from {CORRECTED_ECC_WARN})", "rerun", advice)
    note = " (corrected, no data lost; normal in small numbers)" if new else ""
    return ok(check, f"corrected ECC +{new}{note}")


def judge_remapped_rows(result: Mapping[str, Any]) -> list[Verdict]:
    """Row remapper (Ampere+): pending = reset needed (FAIL), failed = replace (FAIL)."""
    pending = (counter(result, "remapped_rows_pending", "before"),
               counter(result, "remapped_rows_pending", "after"))
    failed = (counter(result, "remapped_rows_failed", "before"),
              counter(result, "remapped_rows_failed", "after"))
    if pending[1] is None and failed[1] is None:
        return [na("faults.remapped_rows.pending", "row remapping (not on this GPU)")]
    verdicts = []
    if failed[1]:
        when = "had already failed before the run" if failed[0] else "failed during the run"
        verdicts.append(Verdict("faults.remapped_rows.failed", Status.FAIL, f"a memory row "
                                f"remap {when}: the GPU could not replace a bad row",
                                "replace-hardware", "drain the node and replace the GPU"))
    if pending[1]:
        when = ("was already pending before the run (not caused by it)" if pending[0]
                else "became pending during the run")
        verdicts.append(Verdict("faults.remapped_rows.pending", Status.FAIL, f"a memory row "
                                f"remap {when}: a bad row waits for a GPU reset", "reset-gpu",
                                f"{RESET}; until then the bad row can fail again"))
    return verdicts or [ok("faults.remapped_rows.pending", "no row remap pending or failed")]


def judge_retired_pages(result: Mapping[str, Any]) -> Verdict:
    """Page retirement (before Ampere): DBE-retired or pending pages FAIL, SBE ones WARN."""
    check = "faults.retired_pages"
    dbe, sbe = counter(result, "retired_pages_dbe"), counter(result, "retired_pages_sbe")
    pending = counter(result, "retired_pages_pending", "after")
    if dbe is None and sbe is None and pending is None:
        return na(check, "page retirement (newer GPUs remap rows instead)")
    advice = f"the retirement takes effect at the next reset: {RESET}"
    if dbe:
        return Verdict(check, Status.FAIL, f"{plural(dbe, 'page')} retired for double-bit "
                       "ECC errors during the run", "reset-gpu", advice)
    if sbe:
        return Verdict(check, Status.WARN, f"{plural(sbe, 'page')} retired for repeated "
                       "single-bit ECC errors during the run", "reset-gpu", advice)
    if pending:
        return Verdict(check, Status.FAIL, "a page retirement is pending (since before the "
                       "run)", "reset-gpu", advice)
    return ok(check, "retired pages +0")


def judge_bank_remaps(result: Mapping[str, Any]) -> list[Verdict]:
    """The bank remapper, beside the row remapper (nvmlEccBankRemapperStatus_v1_t as
    field values): a pending bank remap is a FAIL like a pending row remap (a reset
    applies it); new bank remappings during the run are a WARN to watch (the memory
    repaired a bank under this load); nothing where the GPU lacks the remapper."""
    pending = (counter(result, "bank_remap_pending", "before"),
               counter(result, "bank_remap_pending", "after"))
    grown = {k: counter(result, f"bank_remaps_{k}") for k in ("active", "inactive")}
    if pending[1] is None and all(v is None for v in grown.values()):
        return []
    if pending[1]:
        when = ("was already pending before the run (not caused by it)" if pending[0]
                else "became pending during the run")
        return [Verdict("faults.bank_remap.pending", Status.FAIL, f"a memory bank remap "
                        f"{when}: it waits for a GPU reset", "reset-gpu", RESET)]
    new = sum(v for v in grown.values() if v and v > 0)
    if new:
        return [Verdict("faults.bank_remaps", Status.WARN, f"{plural(new, 'new bank remapping')}"
                        f" during the run ({grown['active'] or 0} active, "
                        f"{grown['inactive'] or 0} inactive): the memory replaced a bank "
                        "under this load", "rerun", "run again and watch nvidia-smi -q -d "
                        "ROW_REMAPPER: remappings that keep growing mean failing memory "
                        "(replace the GPU)")]
    return [ok("faults.bank_remaps", "bank remappings +0, none pending")]


def judge_memory(result: Mapping[str, Any]) -> list[Verdict]:
    """Every memory verdict on one rank's result."""
    return [judge_uncorrected_ecc(result), judge_corrected_ecc(result),
            *judge_remapped_rows(result), *judge_bank_remaps(result),
            judge_retired_pages(result)]
