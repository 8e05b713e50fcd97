"""The link verdicts: PCIe replays, NVLink up/down, recovery and CRC/replay errors, and
NVLink5's counters on Blackwell, at DCGM's rates and thresholds (docs/faults.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.faults.counters import COUNTERS, decode_ber
from gpucheck.faults.judge import counter, fault
from gpucheck.report import Finding, Status, ok, skip

PCIE_REPLAYS_PER_MIN = 8  # DCGM's limit ("8 replays per minute is the maximum recommended")
NVLINK_ERRORS_PER_S = 100.0  # DCGM: "CRC errors only matter at rates of 100+ per second"
BER_ZERO = (15, 255)  # the packed (mantissa, exponent) NVML gives for a BER of zero (DCGM)
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
        # Links are up (judge_nvlink checked), so the counters were refused, not absent:
        # NVML removed them on Blackwell (change log, v560 -> v565). Say so.
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
    recovery = d["recovery"]
    return ok(check, f"NVLink CRC/replay +{errors}{note}, recovery "
                     f"{'n/a' if recovery is None else f'+{recovery}'}")


def ber_words(raw: int | None) -> str:
    if raw is None:
        return "n/a"
    mantissa, exponent = decode_ber(raw)
    zero = mantissa == 0 or (mantissa, exponent) == BER_ZERO
    return "0" if zero else f"{mantissa}e-{exponent}"


def effective_ber_too_high(raw: int) -> bool:
    """DCGM's IsEffectiveBerThresholdExceeded: worse than 1e-12."""
    mantissa, exponent = decode_ber(raw)
    if (mantissa, exponent) == BER_ZERO or mantissa == 0:
        return False
    return (exponent < 12 or (exponent == 12 and mantissa > 1)
            or (exponent == 13 and mantissa > 10))


def symbol_ber_too_high(raw: int) -> bool:
    """DCGM's IsSymbolBerThresholdExceeded (all links): worse than 15e-238."""
    mantissa, exponent = decode_ber(raw)
    if mantissa == 0:
        return False
    return exponent < SYMBOL_BER_FLOOR_EXP or (exponent == SYMBOL_BER_FLOOR_EXP
                                                and mantissa > 15)


def judge_nvlink5(result: Mapping[str, Any]) -> list[Finding]:
    """NVLink5 counters over all links: a recovery event FAILs (as DCGM); effective
    errors or a BER over DCGM's threshold WARN; SKIP where the GPU lacks them."""
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
    """A BER over DCGM's threshold condemns the links; the effective error count alone
    (a deprecated field) asks for the diagnostics first, never for a part."""
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
    # Bin b counts codewords in which the FEC corrected b symbols: bin 0 (nothing to
    # correct) is no corrected error, so it is not summed.
    fec = [counter(result, f"nvlink5_fec_history_{b}") for b in range(1, 16)]
    corrected = sum(v for v in fec if v) if any(v is not None for v in fec) else None
    return [ok("faults.nvlink5.errors", f"NVLink5 effective errors +{effective or 0}, "
            f"symbol errors {'n/a' if symbol is None else f'+{symbol}'} (FEC-corrected "
            f"{'n/a' if corrected is None else f'+{corrected}'}), effective BER "
            f"{ber_words(counter(result, 'nvlink5_effective_ber', 'after'))}, symbol BER "
            f"{ber_words(counter(result, 'nvlink5_symbol_ber', 'after'))}")]


def judge_links(result: Mapping[str, Any]) -> list[Finding]:
    return [judge_pcie(result), *judge_nvlink(result), *judge_nvlink5(result)]
