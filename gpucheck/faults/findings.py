"""Rank 0's findings and "faults" section from every rank's `FaultWatch.result()`, the
ranks that used one GPU merged; a counter the GPU lacks is n/a, never a FAIL."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import GpuIdentity, normal_bus_id
from gpucheck.faults.clocks import (
    SLOWDOWN_MIN_SAMPLES,
    SLOWDOWN_WARN_FRACTION,
    SM_LOW_FRACTION,
    SUSTAINED_SAMPLES,
    judge_clocks,
    slowdown_pct,
)
from gpucheck.faults.judge import (
    CORRECTED_ECC_WARN,
    EVENT_VERDICTS,
    NVLINK_ERRORS_PER_S,
    PCIE_REPLAYS_PER_MIN,
    counter,
    events_of,
    judge_errors,
    judge_events,
    judge_links,
    judge_memory,
)
from gpucheck.probes.xid_table import RECOVERY_ACTIONS, recovery_action, xid_info
from gpucheck.report import Finding, Section, Status, skip, worst

__all__ = ["EVENT_VERDICTS", "RECOVERY_ACTIONS", "fault_findings", "faults_section",
           "gpu_names", "judge", "run_faults_section"]
TITLE = "Hardware faults during the run"
NOT_BACK = "its watch did not come back (the run ended before the ranks' results were gathered)"


def judge(result: Mapping[str, Any]) -> list[Finding]:
    """Every verdict on one watched rank's result (no subject yet)."""
    return [*judge_errors(result), *judge_memory(result), *judge_links(result),
            *judge_events(result), judge_clocks(result)]


@dataclass(frozen=True)
class GpuGroup:
    """The ranks that watched one physical GPU (same host, same bus id)."""

    ranks: tuple[int, ...]
    host: str | None
    label: str
    nvml_index: int | None
    results: tuple[Mapping[str, Any], ...]

    def subject(self, multi_host: bool) -> subjects.Subject:
        """"rank 2 on GPU 3 (...)": the GPU, the rank (or ranks) that watched it."""
        who = ("rank " if len(self.ranks) == 1 else "ranks ") + ", ".join(map(str, self.ranks))
        where = f"{self.host} " if multi_host and self.host else ""
        one = self.ranks[0] if len(self.ranks) == 1 else None
        return subjects.gpu(self.nvml_index, f"{who} on {where}{self.label}", rank=one,
                            host=self.host, ranks=self.ranks if one is None else None)


def group_by_gpu(results: Sequence[Mapping[str, Any]],
                 names: Mapping[int, str]) -> tuple[list[GpuGroup], dict[str, list[int]]]:
    """Watched results grouped per physical GPU, and the n/a ranks grouped per reason."""
    gpus: dict[tuple[Any, Any], list[tuple[int, Mapping[str, Any]]]] = {}
    not_watched: dict[str, list[int]] = {}
    for position, result in enumerate(results):
        rank = position if result.get("rank") is None else int(result["rank"])
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


def _merge(per_rank: Sequence[list[Finding]]) -> list[Finding]:
    """Per check, the findings of the rank that saw it worst (the first on a tie)."""
    chosen: dict[str, list[Finding]] = {}
    for findings in per_rank:
        mine: dict[str, list[Finding]] = {}
        for f in findings:
            mine.setdefault(f.check, []).append(f)
        for check, seen in mine.items():
            kept = chosen.get(check)
            if kept is None or (max(f.status.severity for f in seen)
                                > max(f.status.severity for f in kept)):
                chosen[check] = seen
    return [f for seen in chosen.values() for f in seen]


def _gpu_findings(group: GpuGroup, verdicts: list[Finding],
                  subject: subjects.Subject) -> list[Finding]:
    """The WARN/FAIL verdicts with their subject; OK and n/a ones one summary line."""
    index = "<index>" if group.nvml_index is None else str(group.nvml_index)
    faults = [dataclasses.replace(v, subject=subject, hint=(v.hint or "").replace(
        "<index>", index)) for v in verdicts if v.status in (Status.WARN, Status.FAIL)]
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


def _gpu_row(group: GpuGroup, verdicts: list[Finding]) -> dict[str, Any]:
    r = group.results[0]
    faults = [v for v in verdicts if v.status in (Status.WARN, Status.FAIL)]
    top = max(faults, key=lambda v: v.status.severity) if faults else None
    judged = [v.status for v in verdicts if v.status is not Status.SKIP]
    clocks, cost = r.get("clocks") or {}, r.get("cost") or {}
    watched_s = r.get("watched_s") or 0.0
    return {
        "ranks": ", ".join(map(str, group.ranks)), "host": group.host, "gpu": group.label,
        "verdict": worst(judged).value if judged else Status.SKIP.value,
        "action": (top.action or "none") if top else "none",
        "ecc_uncorrected": counter(r, "ecc_uncorrected"),
        "ecc_corrected": counter(r, "ecc_corrected"),
        "remap_pending": counter(r, "remapped_rows_pending", "after"),
        "remap_failed": counter(r, "remapped_rows_failed", "after"),
        "retired_pages": _sum([counter(r, "retired_pages_dbe"),
                               counter(r, "retired_pages_sbe")]),
        "pcie_replays": counter(r, "pcie_replays"),
        "nvlink_errors": _sum([counter(r, f"nvlink_{n}") for n in
                               ("crc_flit", "crc_data", "replay", "recovery")]),
        "xid_events": len(events_of(r, "xid")) if r.get("events_registered") else None,
        "slowdown_pct": slowdown_pct(clocks),
        "clock_samples": clocks.get("samples"),
        # The thread's own CPU; its NVML calls run in the driver with the GIL released.
        "watcher_cpu_pct": round(100 * cost.get("thread_cpu_s", 0.0) / watched_s, 3)
        if watched_s else None,
    }


THRESHOLDS = {"corrected_ecc_warn": CORRECTED_ECC_WARN,
              "pcie_replays_per_min_warn": PCIE_REPLAYS_PER_MIN,
              "nvlink_errors_per_s_warn": NVLINK_ERRORS_PER_S,
              "slowdown_warn_fraction": SLOWDOWN_WARN_FRACTION,
              "slowdown_min_samples": SLOWDOWN_MIN_SAMPLES,
              "hw_slowdown_sm_low_fraction": SM_LOW_FRACTION,
              "hw_slowdown_sustained_samples": SUSTAINED_SAMPLES}


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
        # Ranks sharing a GPU each got the same events: list one rank's (the fullest).
        r = max(group.results, key=lambda res: len(res.get("events") or []))
        data["events"].extend({"rank": r.get("rank"), "gpu": group.label, "t_s": e.get("t_s"),
                               "in_timed_loop": e.get("in_timed_loop"), "kind": e.get("kind"),
                               "xid": e.get("xid"), **dict(zip(("meaning", "action"),
                                                               meaning(e), strict=True))}
                              for e in r.get("events") or [])
    for reason, ranks in not_watched.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        findings.append(skip("faults.watch", f"hardware fault watching n/a on {who}: {reason}"))
        data["not_watched"].append({"ranks": ", ".join(map(str, ranks)), "reason": reason})
    if not results:
        findings.append(skip("faults.watch", "no rank brought back a fault watch"))
    if not groups:  # nothing was watched, so nothing was judged against them
        del data["thresholds"]
    return findings, data


def fault_findings(results: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str] | None = None) -> list[Finding]:
    """Findings for every rank's result; `names`: rank -> the GPU label the rest of the
    report uses (default: the label the watcher read itself)."""
    return _build(results, names or {})[0]


def faults_section(results: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str] | None = None) -> Section:
    """The "faults" section: per-GPU deltas, the faults with their actions, the events."""
    findings, data = _build(results, names or {})
    return Section("faults", TITLE, data, findings)


def gpu_names(ranks: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Rank -> its physical GPU's label, from check-in rows (`RankInfo` as a dict); CPU
    rows and rows without a bus id are left out (the watcher's own label is used)."""
    names = {}
    for row in ranks:
        if not row.get("pci_bus_id"):
            continue
        name = str(row.get("device") or "").partition(" ")[2] or row.get("gpu_name")
        names[int(row["rank"])] = GpuIdentity(None, row.get("nvml_index"), name or None,
                                              row["pci_bus_id"], row.get("uuid")).label()
    return names


def run_faults_section(results: Sequence[Mapping[str, Any] | None],
                       ranks: Iterable[int] = (),
                       names: Mapping[int, str] | None = None) -> Section:
    """The faults section of a load command from the results that came back (all of
    them, or a failed run's reporting rank's own); a rank in `ranks` without one is
    named n/a, never left out."""
    back = [r for r in results if r is not None]
    seen = {r.get("rank") for r in back}
    back += [{"rank": rank, "status": "n/a", "reason": NOT_BACK}
             for rank in sorted(set(ranks)) if rank not in seen]
    return faults_section(back, names)


# The ECC events count into the ECC verdicts; in the events table:
_ECC_WORDS = {"ecc_uncorrected": ("uncorrected ECC error", "drain-node"),
              "ecc_corrected": ("corrected ECC error", "none"),
              "ecc_corrected_storm": ("storm of corrected ECC errors", "rerun")}


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
