"""Rank 0's verdicts on every rank's `FaultWatch.result()`: findings and a section.

What `dcgmi health -c` would say after the run, from the counters, events and
clock samples each rank brought back. Only what changed during the run is a
fault, except a pending or failed row remap / page retirement, which is one
whenever it is seen. A counter the GPU lacks is n/a (listed in the summary),
never a FAIL. The thresholds and why they are where they are: docs/faults.md.

Every WARN/FAIL hint starts with its action, one of `xid_table.ACTIONS`
("action: drain-node: ..."), and the same word is in the section's `faults` rows.
Ranks that used the same GPU (same host and bus id) share one set of findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.devices import normal_bus_id
from gpucheck.faults.clocks import REASON_WORDS
from gpucheck.faults.counters import LOST_KINDS
from gpucheck.probes.gpus import BAD_CLOCK_REASONS
from gpucheck.probes.xid_table import ACTIONS, RECOVERY_ACTIONS, xid_info
from gpucheck.report import Finding, Section, Status, skip, worst

TITLE = "Hardware faults during the run"
CORRECTED_ECC_WARN = 10  # corrected errors in one run that make a WARN
PCIE_REPLAYS_PER_MIN = 8  # DCGM's limit ("8 replays per minute is the maximum recommended")
NVLINK_ERRORS_PER_S = 100.0  # DCGM: "CRC errors only matter at rates of 100+ per second"
SLOWDOWN_WARN_FRACTION = 0.10  # of the window: at least ~5% of throughput lost
SLOWDOWN_MIN_SAMPLES = 5  # fewer cannot tell 10% from noise

_RESET = "reset the GPU (nvidia-smi -r -i <index>) when it is idle, or reboot the node"
_COOLING = ("the GPU slowed itself down to protect itself: check cooling (fans, airflow, "
            "inlet temperature) and the power supply; nvidia-smi -q -d "
            "PERFORMANCE,TEMPERATURE,POWER shows the reasons and their counters")
# NVML event kind (gpucheck.faults.events) -> (status, action, meaning, advice).
EVENT_VERDICTS: dict[str, tuple[Status, str, str, str]] = {
    "dram_retirement": (Status.WARN, "reset-gpu", "a memory row remap or page retirement "
                        "was recorded", f"it takes effect at the next reset: {_RESET}"),
    "dram_retirement_failure": (Status.FAIL, "replace-hardware", "the GPU failed to record a "
                                "row remap or page retirement", "drain the node and replace "
                                "the GPU"),
    "poison_contained": (Status.WARN, "restart-app", "a contained (non-fatal) poisoned-memory "
                         "error", "only the programs using that memory were stopped: restart "
                         f"them; {_RESET} to remap the row"),
    "poison_uncontained": (Status.FAIL, "reset-gpu", "an uncontained (fatal) poisoned-memory "
                           "error", "every program on this GPU is affected: drain the node and "
                           "reset the GPU before using it again"),
    "gpu_unavailable": (Status.FAIL, "drain-node", "the GPU became unavailable",
                        "drain the node; check dmesg for Xid errors; reset or reboot"),
}
# RECOVERY_ACTIONS (NVML_GPU_RECOVERY_ACTION_*, the eventData of a recovery-action
# event -> our action) lives in xid_table: it also judges the kernel log's XID 154 lines.


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


def _ok(check: str, message: str) -> Verdict:
    return Verdict(check, Status.OK, message)


def _na(check: str, message: str) -> Verdict:
    return Verdict(check, Status.SKIP, message)


def _counter(result: Mapping[str, Any], name: str, which: str = "delta") -> int | None:
    return ((result.get("counters") or {}).get(name) or {}).get(which)


def _events(result: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in result.get("events") or [] if e.get("kind") == kind]


def _registered(result: Mapping[str, Any], kind: str) -> bool:
    return kind in (result.get("events_registered") or [])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def judge_errors(result: Mapping[str, Any]) -> list[Verdict]:
    """The GPU stopped answering (lost, needs a reset, driver hang): FAIL; other
    watcher trouble: WARN, and what was read before it is still judged."""
    errors = result.get("errors") or []
    lost = [e for e in errors if e.get("kind") in LOST_KINDS]
    if lost:
        first = lost[0]
        return [Verdict("faults.gpu_lost", Status.FAIL, f"the GPU stopped answering NVML "
                        f"{first['phase']}: {first['message']}", "drain-node",
                        "check dmesg for Xid 79 ('fallen off the bus'); reset the GPU "
                        "(nvidia-smi -r -i <index>) or reboot the node; replace it if it "
                        "happens again")]
    return [Verdict("faults.watch", Status.WARN, f"the fault watcher ran into trouble "
                    f"{e['phase']} ({e['message']}); what it could not read is n/a",
                    "rerun", "run again; report a gpucheck bug if it repeats", key=str(i))
            for i, e in enumerate(errors)]


def judge_uncorrected_ecc(result: Mapping[str, Any]) -> Verdict:
    """Any new uncorrected (double-bit) ECC error: FAIL, drain the node."""
    check, count = "faults.ecc.uncorrected", _counter(result, "ecc_uncorrected")
    events = len(_events(result, "ecc_uncorrected"))
    if count is None and not _registered(result, "ecc_uncorrected"):
        return _na(check, "uncorrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new:
        errors = _plural(new, "new uncorrected (double-bit) ECC error")
        return Verdict(check, Status.FAIL, f"{errors} during the run", "drain-node",
                       "the GPU's memory returned data it could not correct: drain the node, "
                       "reset the GPU (nvidia-smi -r -i <index>) so the row is remapped or the "
                       "page retired, and replace the GPU if errors return")
    return _ok(check, "uncorrected ECC +0")


def judge_corrected_ecc(result: Mapping[str, Any]) -> Verdict:
    """Corrected errors are normal in small numbers: WARN from CORRECTED_ECC_WARN on,
    or when the driver reports a storm of them."""
    check, count = "faults.ecc.corrected", _counter(result, "ecc_corrected")
    events = len(_events(result, "ecc_corrected"))
    advice = ("ECC corrected them and no data was lost; run again and watch nvidia-smi -q -d "
              "ECC: a count that keeps growing means failing memory (replace the GPU)")
    if _events(result, "ecc_corrected_storm"):
        return Verdict(check, Status.WARN, "the driver reported a storm of corrected "
                       "(single-bit) ECC errors during the run", "rerun", advice)
    if count is None and not _registered(result, "ecc_corrected"):
        return _na(check, "corrected ECC (ECC off or not reported)")
    new = max(count or 0, events)
    if new >= CORRECTED_ECC_WARN:
        return Verdict(check, Status.WARN, f"{new} corrected (single-bit) ECC errors during "
                       f"the run (WARN from {CORRECTED_ECC_WARN})", "rerun", advice)
    note = " (corrected, no data lost; normal in small numbers)" if new else ""
    return _ok(check, f"corrected ECC +{new}{note}")


def judge_remapped_rows(result: Mapping[str, Any]) -> list[Verdict]:
    """Row remapper (Ampere+): pending = reset needed (FAIL), failed = replace (FAIL)."""
    pending = (_counter(result, "remapped_rows_pending", "before"),
               _counter(result, "remapped_rows_pending", "after"))
    failed = (_counter(result, "remapped_rows_failed", "before"),
              _counter(result, "remapped_rows_failed", "after"))
    if pending[1] is None and failed[1] is None:
        return [_na("faults.remapped_rows.pending", "row remapping (not on this GPU)")]
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
                                f"{_RESET}; until then the bad row can fail again"))
    return verdicts or [_ok("faults.remapped_rows.pending", "no row remap pending or failed")]


def judge_retired_pages(result: Mapping[str, Any]) -> Verdict:
    """Page retirement (before Ampere): DBE-retired or pending pages FAIL, SBE ones WARN."""
    check = "faults.retired_pages"
    dbe, sbe = _counter(result, "retired_pages_dbe"), _counter(result, "retired_pages_sbe")
    pending = _counter(result, "retired_pages_pending", "after")
    if dbe is None and sbe is None and pending is None:
        return _na(check, "page retirement (newer GPUs remap rows instead)")
    advice = f"the retirement takes effect at the next reset: {_RESET}"
    if dbe:
        return Verdict(check, Status.FAIL, f"{_plural(dbe, 'page')} retired for double-bit "
                       "ECC errors during the run", "reset-gpu", advice)
    if sbe:
        return Verdict(check, Status.WARN, f"{_plural(sbe, 'page')} retired for repeated "
                       "single-bit ECC errors during the run", "reset-gpu", advice)
    if pending:
        return Verdict(check, Status.FAIL, "a page retirement is pending (since before the "
                       "run)", "reset-gpu", advice)
    return _ok(check, "retired pages +0")


def judge_pcie(result: Mapping[str, Any]) -> Verdict:
    """PCIe replays: WARN above PCIE_REPLAYS_PER_MIN a minute (at least that many in a
    run shorter than a minute)."""
    check, count = "faults.pcie.replay", _counter(result, "pcie_replays")
    if count is None:
        return _na(check, "PCIe replay counter")
    minutes = max(1.0, (result.get("watched_s") or 0.0) / 60.0)
    if count > PCIE_REPLAYS_PER_MIN * minutes:
        return Verdict(check, Status.WARN, f"{count} PCIe replays during the run "
                       f"({count / minutes:.0f} a minute; the limit is {PCIE_REPLAYS_PER_MIN})",
                       "replace-hardware", "the PCIe link kept retransmitting: at the next "
                       "maintenance reseat the GPU and check its riser, cable and slot; "
                       "replace the part if replays continue (nvidia-smi -q | grep -i replay)")
    return _ok(check, f"PCIe replays +{count}")


def _links(result: Mapping[str, Any], counter: str) -> str:
    grown = result.get("nvlink_links_grown") or {}
    links = sorted((int(k) for k, v in grown.items() if v.get(counter)))
    return f" (link {', '.join(map(str, links))})" if links else ""


def judge_nvlink(result: Mapping[str, Any]) -> list[Verdict]:
    """A link that went down or a recovery (retraining): FAIL; CRC/replay errors at
    NVLINK_ERRORS_PER_S or more: WARN; fewer: noted, OK."""
    active = (_counter(result, "nvlink_active_links", "before"),
              _counter(result, "nvlink_active_links", "after"))
    d = {n: _counter(result, f"nvlink_{n}") for n in ("crc_flit", "crc_data", "replay",
                                                       "recovery")}
    if active[0] is None or (not active[0] and not active[1]):
        return [_na("faults.nvlink.crc", "NVLink (none on this GPU)")]
    verdicts = []
    if active[1] is not None and active[1] < active[0]:
        verdicts.append(Verdict("faults.nvlink.down", Status.FAIL, f"{active[0] - active[1]} "
                                f"NVLink link(s) went down during the run ({active[0]} active "
                                f"before, {active[1]} after)", "reset-gpu", "check nvidia-smi "
                                "nvlink --status; reset the GPU with its NVLink peers, and "
                                "have the NVLink/NVSwitch hardware checked if a link stays down"))
    if d["recovery"]:
        verdicts.append(Verdict("faults.nvlink.recovery", Status.FAIL, f"{d['recovery']} "
                                f"NVLink recovery error(s) during the run"
                                f"{_links(result, 'nvlink_recovery')}: a link dropped and "
                                "retrained, stalling its traffic", "reset-gpu", "reset the GPU "
                                "with its NVLink peers (nvidia-smi nvlink -e shows the "
                                "counters); drain the node and have the link hardware checked "
                                "if it recurs"))
    verdicts.append(_nvlink_errors(result, d))
    return verdicts


def _nvlink_errors(result: Mapping[str, Any], d: dict[str, int | None]) -> Verdict:
    check = "faults.nvlink.crc"
    if all(d[n] is None for n in ("crc_flit", "crc_data", "replay")):
        # Links are up (judge_nvlink checked), so the counters were refused, not absent:
        # NVML removed them on Blackwell (change log, v560 -> v565). Say so.
        return _na(check, "NVLink error counters (NVML answers NotSupported on the active "
                   "links: it removed them on Blackwell, B200/GB200, from driver R565; "
                   "NVLink faults still arrive as XIDs 144-150)")
    # A CRC error is answered by a replay: count the larger side, not both.
    errors = max((d["crc_flit"] or 0) + (d["crc_data"] or 0), d["replay"] or 0)
    seconds = result.get("watched_s") or 0.0
    rate = errors / seconds if seconds > 0 else 0.0
    where = _links(result, "nvlink_crc_flit") or _links(result, "nvlink_replay")
    if errors and rate >= NVLINK_ERRORS_PER_S:
        return Verdict(check, Status.WARN, f"{errors} NVLink CRC/replay errors during the run"
                       f"{where}, {rate:.0f}/s (WARN from {NVLINK_ERRORS_PER_S:.0f}/s): a "
                       "marginal link, retransmitting", "replace-hardware", "reset the GPU with "
                       "its NVLink peers; if the rate stays high, have the NVLink bridge, cable "
                       "or NVSwitch tray checked (nvidia-smi nvlink -e)")
    note = f"{where}, corrected by replay, {rate:.1f}/s" if errors else ""
    recovery = d["recovery"]
    return _ok(check, f"NVLink CRC/replay +{errors}{note}, recovery "
                      f"{'n/a' if recovery is None else f'+{recovery}'}")


def _when(events: Sequence[Mapping[str, Any]]) -> str:
    first = events[0]
    where = ", in the timed loop" if any(e.get("in_timed_loop") for e in events) else ""
    times = "once" if len(events) == 1 else f"{len(events)} times"
    return f"{times} during the run (first {first.get('t_s')} s after the watch began{where})"


def judge_xids(result: Mapping[str, Any]) -> list[Verdict]:
    """Each XID seen, classified by the package's XID table; application-level ones
    (13, 31, 43, ...) are information, not a GPU fault."""
    by_xid: dict[int, list[dict[str, Any]]] = {}
    for event in _events(result, "xid"):
        by_xid.setdefault(int(event["xid"]), []).append(event)
    verdicts = []
    for xid, seen in sorted(by_xid.items()):
        info = xid_info(xid)
        message = f"XID {xid} ({info.meaning}) {_when(seen)}"
        if info.severity == "info":
            verdicts.append(_ok("faults.xid", f"application-level {message}: information, "
                                "not a GPU fault"))
            continue
        status = Status.FAIL if info.severity == "fail" else Status.WARN
        verdicts.append(Verdict("faults.xid", status, message, info.action, info.advice,
                                key=str(xid)))
    return verdicts


def judge_events(result: Mapping[str, Any]) -> list[Verdict]:
    """XIDs and the memory/availability events; n/a when no event set could be registered."""
    if result.get("events_registered") is None:
        why = result.get("events_reason") or "not registered"
        return [_na("faults.xid", f"XID/ECC events ({why})")]
    verdicts = judge_xids(result)
    for kind, (status, action, meaning, advice) in EVENT_VERDICTS.items():
        seen = _events(result, kind)
        if seen:
            verdicts.append(Verdict(f"faults.event.{kind}", status, f"NVML event: {meaning}, "
                                    f"{_when(seen)}", action, advice))
    for event in _events(result, "gpu_recovery_action"):
        what, action = RECOVERY_ACTIONS.get(int(event["data"]), (None, "none"))
        if what is not None:
            verdicts.append(Verdict("faults.event.gpu_recovery_action", Status.FAIL,
                                    f"the driver asks for a {what} ({_when([event])})", action,
                                    f"{what} before using the GPU again", key=what))
    unknown = [e for e in result.get("events") or [] if str(e.get("kind")).startswith("event_")]
    if unknown:
        verdicts.append(Verdict("faults.event.unknown", Status.WARN, f"NVML events of a type "
                                f"gpucheck does not know ({unknown[0]['kind']}) {_when(unknown)}",
                                "rerun", "look the event type up in nvml.h; run again"))
    if not verdicts:
        verdicts.append(_ok("faults.xid", "no XID or memory event"))
    return verdicts


def _slowdown_shares(clocks: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Per bad reason: (share of samples, share from the driver's counter or None)."""
    fractions = clocks.get("fractions") or {}
    counters = clocks.get("slowdown_ms") or {}
    window_s = clocks.get("window_s") or 0.0
    shares = {}
    for reason in BAD_CLOCK_REASONS:
        ms = counters.get(reason)
        counted = ms / 1000.0 / window_s if ms is not None and window_s > 0 else None
        shares[reason] = (float(fractions.get(reason, 0.0)), counted)
    return shares


def _headline(reason: str, share: tuple[float, float | None]) -> str:
    return f"{REASON_WORDS[reason]} {max(share[0], share[1] or 0.0) * 100:.0f}%"


def _detail(reason: str, share: tuple[float, float | None], samples: int) -> str:
    sampled, counted = share
    text = f"{REASON_WORDS[reason]} in {sampled * 100:.0f}% of {samples} samples"
    return text + (f", {counted * 100:.0f}% by the driver's counter" if counted is not None
                   else "")


def _bad_slowdowns(clocks: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """The slowdowns held for SLOWDOWN_WARN_FRACTION of the window or more: sampled (with
    at least SLOWDOWN_MIN_SAMPLES samples), or by the driver's own counter alone."""
    judged = int(clocks.get("samples") or 0) >= SLOWDOWN_MIN_SAMPLES
    return {r: s for r, s in _slowdown_shares(clocks).items()
            if (judged and s[0] >= SLOWDOWN_WARN_FRACTION)
            or (s[1] is not None and s[1] >= SLOWDOWN_WARN_FRACTION)}


def _window_words(clocks: Mapping[str, Any]) -> str:
    return "timed loop" if clocks.get("window") == "timed" else "watched run"


def judge_clocks(result: Mapping[str, Any]) -> Verdict:
    """HW slowdown, HW/SW thermal slowdown or HW power brake for SLOWDOWN_WARN_FRACTION
    of the window or more (sampled, or by the driver's own counter): WARN."""
    check, clocks = "faults.clocks.slowdown", result.get("clocks") or {}
    if clocks.get("fractions") is None:
        return _na(check, "clock-event reasons")
    window = _window_words(clocks)
    samples, window_s = int(clocks.get("samples") or 0), clocks.get("window_s")
    shares = _slowdown_shares(clocks)
    judged = samples >= SLOWDOWN_MIN_SAMPLES
    bad = _bad_slowdowns(clocks)
    if bad:
        words = ", ".join(_headline(r, s) for r, s in bad.items())
        details = "; ".join(_detail(r, s, samples) for r, s in bad.items())
        return Verdict(check, Status.WARN, f"was in {words} of the {window} ({window_s} s: "
                       f"{details})", "drain-node", _COOLING)
    span = f"{window_s} s, {samples} samples"
    if not judged:
        return _na(check, f"slowdowns (too few clock samples: {span})")
    seen = [_headline(r, s) for r, s in shares.items() if s[0] or s[1]]
    power = (clocks.get("fractions") or {}).get("sw_power_cap")
    if power:  # the power limit is doing its job: information
        seen.append(f"at its power limit {power * 100:.0f}%")
    return _ok(check, f"no slowdown in the {window} ({span})" + (
        f"; briefly: {', '.join(seen)}" if seen else ""))


def slowdown_causes(results: Sequence[Mapping[str, Any]],
                    window: str | None = None) -> dict[int, str]:
    """Rank -> why its clocks were down, for ranks over the slowdown threshold:
    "was in HW thermal slowdown 40% of the timed loop" (the words of the
    faults.clocks.slowdown WARN). For the straggler findings, which name a slow rank
    and can then say what slowed it. `window` replaces the window's words ("measured
    phases"); n/a and unwatched ranks are left out."""
    causes: dict[int, str] = {}
    for position, result in enumerate(results):
        clocks = result.get("clocks") or {}
        if result.get("status") != "watched" or clocks.get("fractions") is None:
            continue
        bad = _bad_slowdowns(clocks)
        if bad:
            words = ", ".join(_headline(r, s) for r, s in bad.items())
            causes[_rank(result, position)] = (f"was in {words} of the "
                                               f"{window or _window_words(clocks)}")
    return causes


def judge(result: Mapping[str, Any]) -> list[Verdict]:
    """Every verdict on one watched rank's result."""
    return [*judge_errors(result), judge_uncorrected_ecc(result), judge_corrected_ecc(result),
            *judge_remapped_rows(result), judge_retired_pages(result), judge_pcie(result),
            *judge_nvlink(result), *judge_events(result), judge_clocks(result)]


@dataclass(frozen=True)
class GpuGroup:
    """The ranks that watched one physical GPU (same host, same bus id)."""

    ranks: tuple[int, ...]
    host: str | None
    label: str
    nvml_index: int | None
    results: tuple[Mapping[str, Any], ...]

    def subject(self, multi_host: bool) -> str:
        who = ("rank " if len(self.ranks) == 1 else "ranks ") + ", ".join(map(str, self.ranks))
        where = f"{self.host} " if multi_host and self.host else ""
        return f"{who} on {where}{self.label}"


def _rank(result: Mapping[str, Any], position: int) -> int:
    rank = result.get("rank")
    return position if rank is None else int(rank)


def group_by_gpu(results: Sequence[Mapping[str, Any]],
                 names: Mapping[int, str]) -> tuple[list[GpuGroup], dict[str, list[int]]]:
    """Watched results grouped per physical GPU, and the n/a ranks grouped per reason."""
    gpus: dict[tuple[Any, Any], list[tuple[int, Mapping[str, Any]]]] = {}
    not_watched: dict[str, list[int]] = {}
    for position, result in enumerate(results):
        rank = _rank(result, position)
        if result.get("status") != "watched":
            not_watched.setdefault(result.get("reason") or "not watched", []).append(rank)
            continue
        bus = normal_bus_id(result.get("nvml_bus_id") or result.get("bus_id"))
        gpus.setdefault((result.get("host"), bus or f"rank {rank}"), []).append((rank, result))
    groups = []
    for (host, _bus), members in gpus.items():
        first = members[0][1]
        shown_bus = first.get("nvml_bus_id") or first.get("bus_id")
        label = names.get(members[0][0]) or first.get("gpu") or f"the GPU at bus {shown_bus}"
        groups.append(GpuGroup(tuple(r for r, _ in members), host, label,
                               first.get("nvml_index"), tuple(m for _, m in members)))
    return groups, not_watched


def _merge(groups_of_verdicts: Sequence[list[Verdict]]) -> list[Verdict]:
    """One verdict per (check, key): the worst any rank of the GPU saw."""
    merged: dict[tuple[str, str], Verdict] = {}
    for verdicts in groups_of_verdicts:
        for v in verdicts:
            kept = merged.get((v.check, v.key))
            if kept is None or v.status.severity > kept.status.severity:
                merged[(v.check, v.key)] = v
    return list(merged.values())


def _gpu_findings(group: GpuGroup, verdicts: list[Verdict], subject: str) -> list[Finding]:
    """WARN/FAIL verdicts become findings; OK and n/a ones one summary line."""
    index = "<index>" if group.nvml_index is None else str(group.nvml_index)
    faults = [Finding(v.check, v.status, v.message,
                      f"action: {v.action}: {v.advice.replace('<index>', index)}", subject)
              for v in verdicts if v.status in (Status.WARN, Status.FAIL)]
    clean = [v.message for v in verdicts if v.status is Status.OK]
    missing = [v.message for v in verdicts if v.status is Status.SKIP]
    na = f"; n/a: {', '.join(missing)}" if missing else ""
    if clean:
        head = "nothing else new" if faults else "no new hardware fault during the run"
        faults.append(Finding("faults.summary", Status.OK, f"{head}: {'; '.join(clean)}{na}",
                              None, subject))
    elif not faults:
        faults.append(skip("faults.summary", f"no fault counter could be read{na}", subject))
    return faults


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _gpu_row(group: GpuGroup, verdicts: list[Verdict]) -> dict[str, Any]:
    """One GPU's line in the section: deltas (None = n/a), verdict and action."""
    r = group.results[0]
    faults = [v for v in verdicts if v.status in (Status.WARN, Status.FAIL)]
    top = max(faults, key=lambda v: v.status.severity) if faults else None
    judged = [v.status for v in verdicts if v.status is not Status.SKIP]
    clocks, cost = r.get("clocks") or {}, r.get("cost") or {}
    fractions = clocks.get("fractions")
    watched_s = r.get("watched_s") or 0.0
    return {
        "ranks": ", ".join(map(str, group.ranks)), "host": group.host, "gpu": group.label,
        "verdict": worst(judged).value if judged else Status.SKIP.value,
        "action": top.action if top else "none",
        "ecc_uncorrected": _counter(r, "ecc_uncorrected"),
        "ecc_corrected": _counter(r, "ecc_corrected"),
        "remap_pending": _counter(r, "remapped_rows_pending", "after"),
        "remap_failed": _counter(r, "remapped_rows_failed", "after"),
        "retired_pages": _sum([_counter(r, "retired_pages_dbe"),
                               _counter(r, "retired_pages_sbe")]),
        "pcie_replays": _counter(r, "pcie_replays"),
        "nvlink_errors": _sum([_counter(r, f"nvlink_{n}") for n in
                               ("crc_flit", "crc_data", "replay", "recovery")]),
        "xid_events": len(_events(r, "xid")) if r.get("events_registered") else None,
        "slowdown_pct": None if fractions is None else round(100 * max(
            [fractions.get(b, 0.0) for b in BAD_CLOCK_REASONS]), 1),
        "clock_samples": clocks.get("samples"),
        # The thread's own CPU; its NVML calls run in the driver with the GIL released.
        "watcher_cpu_pct": round(100 * cost.get("thread_cpu_s", 0.0) / watched_s, 3)
        if watched_s else None,
    }


def _meaning(event: Mapping[str, Any]) -> tuple[str, str]:
    kind = str(event.get("kind"))
    if kind == "xid":
        info = xid_info(int(event["xid"]))
        return info.meaning, info.action
    if kind in EVENT_VERDICTS:
        return EVENT_VERDICTS[kind][2], EVENT_VERDICTS[kind][1]
    if kind == "gpu_recovery_action":
        what, action = RECOVERY_ACTIONS.get(int(event["data"]), ("no action", "none"))
        return f"the driver asks for: {what}", action
    words = {"ecc_uncorrected": ("uncorrected ECC error", "drain-node"),
             "ecc_corrected": ("corrected ECC error", "none"),
             "ecc_corrected_storm": ("storm of corrected ECC errors", "rerun")}
    return words.get(kind, (f"unknown NVML event ({kind})", "rerun"))


def _event_rows(group: GpuGroup) -> list[dict[str, Any]]:
    # Ranks sharing a GPU each got the same events: list one rank's (the fullest).
    r = max(group.results, key=lambda res: len(res.get("events") or []))
    rows = []
    for event in r.get("events") or []:
        meaning, action = _meaning(event)
        rows.append({"rank": r.get("rank"), "gpu": group.label, "t_s": event.get("t_s"),
                     "in_timed_loop": event.get("in_timed_loop"), "kind": event.get("kind"),
                     "xid": event.get("xid"), "meaning": meaning, "action": action})
    return rows


THRESHOLDS = {"corrected_ecc_warn": CORRECTED_ECC_WARN,
              "pcie_replays_per_min_warn": PCIE_REPLAYS_PER_MIN,
              "nvlink_errors_per_s_warn": NVLINK_ERRORS_PER_S,
              "slowdown_warn_fraction": SLOWDOWN_WARN_FRACTION,
              "slowdown_min_samples": SLOWDOWN_MIN_SAMPLES}


def _build(results: Sequence[Mapping[str, Any]],
           names: Mapping[int, str]) -> tuple[list[Finding], dict[str, Any]]:
    groups, not_watched = group_by_gpu(results, names)
    multi_host = len({g.host for g in groups}) > 1
    findings: list[Finding] = []
    data: dict[str, Any] = {"gpus": [], "faults": [], "events": [], "not_watched": [],
                            "thresholds": THRESHOLDS}
    for group in groups:
        subject = group.subject(multi_host)
        verdicts = _merge([judge(r) for r in group.results])
        findings.extend(_gpu_findings(group, verdicts, subject))
        data["gpus"].append(_gpu_row(group, verdicts))
        data["faults"].extend({"ranks": ", ".join(map(str, group.ranks)), "gpu": group.label,
                               "check": v.check, "status": v.status.value, "action": v.action,
                               "message": v.message}
                              for v in verdicts if v.status in (Status.WARN, Status.FAIL))
        data["events"].extend(_event_rows(group))
    for reason, ranks in not_watched.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        findings.append(skip("faults.watch", f"hardware fault watching n/a on {who}: {reason}"))
        data["not_watched"].append({"ranks": ", ".join(map(str, ranks)), "reason": reason})
    if not results:
        findings.append(skip("faults.watch", "no rank brought back a fault watch"))
    return findings, data


def fault_findings(results: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str] | None = None) -> list[Finding]:
    """Findings for every rank's `FaultWatch.result()`; `names` maps a rank to the GPU
    label the rest of the report uses (default: the label the watcher read itself)."""
    return _build(results, names or {})[0]


def faults_section(results: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str] | None = None) -> Section:
    """The "faults" section: per-GPU deltas, the faults with their actions, the events."""
    findings, data = _build(results, names or {})
    return Section("faults", TITLE, data, findings)
