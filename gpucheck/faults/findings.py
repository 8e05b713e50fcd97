"""Rank 0's verdicts on every rank's `FaultWatch.result()`: findings and a section.

What `dcgmi health -c` would say after the run, from the counters, events and
clock samples each rank brought back. Each kind is judged in its own module
(`gpucheck.faults.verdict` lists them: memory, links, events, clocks, the watcher);
this one runs them on every rank, merges the ranks that used the same GPU (same
host and bus id) into one set of findings, and builds the section. A counter the
GPU lacks is n/a (listed in the summary), never a FAIL. The thresholds and why
they are where they are: docs/faults.md.

Every WARN/FAIL finding carries its verdict's action as the cause "table.<action>"
(gpucheck.checks), and the same word is in the section's `faults` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects
from gpucheck.checks.check import table_cause
from gpucheck.devices import normal_bus_id
from gpucheck.faults.clocks import SM_LOW_FRACTION, SUSTAINED_SAMPLES
from gpucheck.faults.judge_clocks import (
    SLOWDOWN_MIN_SAMPLES,
    SLOWDOWN_WARN_FRACTION,
    judge_clocks,
    slowdown_causes,
    slowdown_pct,
)
from gpucheck.faults.judge_events import EVENT_VERDICTS, judge_events, meaning
from gpucheck.faults.judge_links import NVLINK_ERRORS_PER_S, PCIE_REPLAYS_PER_MIN, judge_links
from gpucheck.faults.judge_memory import CORRECTED_ECC_WARN, judge_memory
from gpucheck.faults.judge_watch import judge_errors
from gpucheck.faults.verdict import Verdict, counter, events_of, rank_of
from gpucheck.probes.xid_table import RECOVERY_ACTIONS
from gpucheck.report import Finding, Section, Status, skip, worst

__all__ = ["CORRECTED_ECC_WARN", "EVENT_VERDICTS", "NVLINK_ERRORS_PER_S",
           "PCIE_REPLAYS_PER_MIN", "RECOVERY_ACTIONS", "SLOWDOWN_MIN_SAMPLES",
           "SLOWDOWN_WARN_FRACTION", "Verdict", "fault_findings", "faults_section", "judge",
           "slowdown_causes"]
TITLE = "Hardware faults during the run"


def judge(result: Mapping[str, Any]) -> list[Verdict]:
    """Every verdict on one watched rank's result."""
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
        rank = rank_of(result, position)
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


def _gpu_findings(group: GpuGroup, verdicts: list[Verdict],
                  subject: subjects.Subject) -> list[Finding]:
    """WARN/FAIL verdicts become findings; OK and n/a ones one summary line."""
    index = "<index>" if group.nvml_index is None else str(group.nvml_index)
    faults = [Finding(v.check, v.status, v.message, v.advice.replace("<index>", index),
                      subject, cause=table_cause(v.action))
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
    watched_s = r.get("watched_s") or 0.0
    return {
        "ranks": ", ".join(map(str, group.ranks)), "host": group.host, "gpu": group.label,
        "verdict": worst(judged).value if judged else Status.SKIP.value,
        "action": top.action if top else "none",
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


def _event_rows(group: GpuGroup) -> list[dict[str, Any]]:
    # Ranks sharing a GPU each got the same events: list one rank's (the fullest).
    r = max(group.results, key=lambda res: len(res.get("events") or []))
    rows = []
    for event in r.get("events") or []:
        what, action = meaning(event)
        rows.append({"rank": r.get("rank"), "gpu": group.label, "t_s": event.get("t_s"),
                     "in_timed_loop": event.get("in_timed_loop"), "kind": event.get("kind"),
                     "xid": event.get("xid"), "meaning": what, "action": action})
    return rows


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
        data["events"].extend(_event_rows(group))
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
    """Findings for every rank's `FaultWatch.result()`; `names` maps a rank to the GPU
    label the rest of the report uses (default: the label the watcher read itself)."""
    return _build(results, names or {})[0]


def faults_section(results: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str] | None = None) -> Section:
    """The "faults" section: per-GPU deltas, the faults with their actions, the events."""
    findings, data = _build(results, names or {})
    return Section("faults", TITLE, data, findings)
