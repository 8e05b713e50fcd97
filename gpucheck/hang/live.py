"""This node's view of its rank processes (plain values), every node's gathered over
the frame `gpucheck env` uses, and the sections built from them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psutil

from gpucheck import subject as subjects
from gpucheck.errors import UsageError
from gpucheck.hang.findings import ARM, label, live_findings
from gpucheck.hang.observe import RankView, watch
from gpucheck.hang.procs import (
    Discovery,
    discover,
    missing_local_ranks,
    node_capacity,
)
from gpucheck.report import Finding, Section, Status, ok, skip


def _dead_by_job(found: Discovery, jobs: list[str], host: str
                 ) -> tuple[dict[str, list[RankView]], list[str]]:
    """Each job's missing local ranks as dead, in watch order, while they fit what this
    machine can hold (`node_capacity`); a note for the jobs left out."""
    capacity = room = node_capacity()
    dead: dict[str, list[RankView]] = {}
    left_out = 0
    for job in jobs:
        room -= len(found.jobs[job])
        ranks = found.jobs[job]
        views = [RankView(rank, local, ranks[0].world_size, None, host, state="exited",
                          state_start="exited")
                 for rank, local in missing_local_ranks(ranks) if rank is not None]
        if len(views) > room:
            left_out += 1
            continue
        room -= len(views)
        dead[job] = views
    notes = [f"{left_out} job(s) claim more ranks than this machine can hold ({capacity} "
             "in all): their missing ranks are not called dead"] if left_out else []
    return dead, notes


def check_pids(pids: Sequence[int] | None, found: Discovery) -> None:
    """Usage errors: PIDs given that are no rank and lead to none."""
    if not pids:
        return
    if found.not_ranks:
        pid = found.not_ranks[0]
        why = found.why_not.get(pid, "no RANK and WORLD_SIZE in its environment, and no "
                                "rank below it")
        raise UsageError(f"PID {pid} is no rank of any job ({why}); give rank PIDs or "
                         "torchrun's PID, or none to judge every job on this node")
    if not found.jobs and len(found.gone) == len(pids):
        raise UsageError(f"no process with PID {', '.join(map(str, pids))}: give the PIDs "
                         "of running ranks (or none, to find them all)")


def _me() -> str:
    try:
        return str(psutil.Process().username())
    except psutil.Error:
        return ""


def node_view(pids: Sequence[int] | None, window_s: float, host: str, node_rank: int,
              nvml_timeout_s: float) -> dict[str, Any]:
    """{jobs: {job: [view dicts]}, notes} of this node; every job's ranks watched at once."""
    found = discover(pids or None)
    check_pids(pids, found)
    # Whole jobs one after the other, the user's own first (others' are left out first).
    me = os.environ.get("SUDO_USER") or _me()
    order = [(job, rank) for job, ranks in sorted(
        found.jobs.items(), key=lambda item: (item[1][0].user != me, item[0])) for rank in ranks]
    views, gpu_note = watch([rank for _, rank in order], host, window_s, nvml_timeout_s)
    jobs: dict[str, list[dict[str, Any]]] = {}
    for (job, _), view in zip(order, views, strict=True):
        jobs.setdefault(job, []).append(view.to_dict())
    dead, bound_notes = _dead_by_job(found, list(jobs), host)
    for job, dead_views in dead.items():
        # A job none of whose processes was watched is not judged: no dead ranks either.
        watched = any(raw["watched"] for raw in jobs[job])
        jobs[job].extend({**v.to_dict(), "watched": watched} for v in dead_views)
    for raw in jobs.values():
        for view_dict in raw:
            view_dict["node_rank"] = node_rank
    notes = [f"PID(s) {', '.join(map(str, found.gone))} no longer exist"] if found.gone else []
    if found.blocked:
        notes.append(f"PID(s) {', '.join(map(str, found.blocked[:20]))}: the environment "
                     "gave no answer in time (1 s each, 0.05 s once 2 s were spent on "
                     "such processes; a process stuck in the kernel with its memory map "
                     "locked: look at its state, /proc/PID/stack)")
    if found.denied:
        notes.append(f"{found.denied} process(es) whose environment could not be read "
                     "(another user's: run as that user or root)")
    notes += bound_notes + ([gpu_note] if gpu_note and found.jobs else [])
    return {"jobs": jobs, "notes": notes}


def live_sections(nodes: Mapping[int, Mapping[str, Any]], window_s: float) -> list[Section]:
    """One section per job, every node's ranks of it judged together, and with several
    jobs a last section listing them."""
    jobs, notes = _merge(nodes)
    if not jobs:
        finding = skip("hang.discovery", "no torch.distributed rank process found (none "
                       "has RANK and WORLD_SIZE, or SLURM_PROCID, in its environment)")
        return [Section("hang", "Hang check", {"notes": notes}, [finding])]
    several = len(jobs) > 1
    sections, rows = [], []
    for job, views in sorted(jobs.items()):
        views.sort(key=lambda v: (v.rank, v.node_rank))
        if not any(v.watched for v in views):  # another user's crowd: a row, no section
            rows.append(job_row(job, views, None))
            continue
        section = ranks_section(job, views, window_s, len(nodes) > 1, notes,
                                job if several else None)
        section.data["jobs_seen"] = len(jobs)
        section.findings.append(armed(views))
        sections.append(section)
        rows.append(job_row(job, views, section))
    # Each job its own part, the stuck ones first: their problems lead the report.
    sections.sort(key=lambda s: -(verdict.severity if (verdict := s.verdict()) else 0))
    if several:
        sections.append(jobs_section(rows))
    return sections


def _merge(nodes: Mapping[int, Mapping[str, Any]]) -> tuple[dict[str, list[RankView]],
                                                             list[str]]:
    jobs: dict[str, list[RankView]] = {}
    notes: list[str] = []
    for node_rank, view in sorted(nodes.items()):
        prefix = f"node {node_rank}: " if len(nodes) > 1 else ""
        notes.extend(prefix + n for n in view.get("notes", []))
        for job, raw in view.get("jobs", {}).items():
            jobs.setdefault(job, []).extend(RankView(**r) for r in raw)
    return jobs, notes


if TYPE_CHECKING:
    from gpucheck.context import RunContext

# A node that has not answered after this long (the window plus seconds) is stuck.
GATHER_TIMEOUT_S = 120.0


def gather_views(pids: Sequence[int], window_s: float, nvml_timeout_s: float,
                 ctx: RunContext) -> dict[int, dict[str, Any]] | None:
    """{node_rank: node view}; None on ranks that do not report. `ctx`: the command's."""
    from gpucheck.distributed.job import launched_world
    from gpucheck.distributed.world import host_name

    world = launched_world(ctx)
    if world is None:
        return {0: node_view(pids, window_s, host_name(), 0, nvml_timeout_s)}
    from gpucheck.distributed.nodes import gather_per_node

    nodes = gather_per_node(
        lambda: node_view(pids, window_s, host_name(), world.node_rank, nvml_timeout_s),
        ctx, fault_watch=False, timeout_s=GATHER_TIMEOUT_S)
    if nodes is None:
        return None
    return {node.node_rank: view for node, view in nodes.items()}


def ranks_section(job: str, views: list[RankView], window_s: float, multi_node: bool,
                  notes: list[str], label_job: str | None = None) -> Section:
    """`label_job` (several jobs seen) puts the job in subjects; one SKIP per watched
    rank whose stack could not be read."""
    rows = [{"rank": v.rank, "local_rank": v.local_rank, "host": v.host, "pid": v.pid,
             "state": v.state, "cpu_pct": None if v.cpu_pct is None else round(v.cpu_pct, 1),
             "gpu": (v.gpu or {}).get("gpu"),
             "gpu_sm_util_pct": (v.gpu or {}).get("gpu_sm_util_pct"),
             "gpu_memory_bytes": (v.gpu or {}).get("gpu_memory_bytes"),
             "where": v.where.describe() if v.where else v.stack_error,
             "pinned": v.pinned, "samples": v.samples} for v in views]
    data: dict[str, Any] = {"job": job, "window_s": window_s, "ranks": rows,
                            "stacks": {f"rank {v.rank}": v.stack for v in views if v.stack}}
    if notes:
        data["notes"] = notes
    of_job = f" of job {label_job}" if label_job else ""
    unread = [skip("hang.stack", f"{label(v)}: {v.stack_error}",
                   subject=subjects.rank(v.rank, f"rank {v.rank}{of_job}"))
              for v in views if v.stack_error and v.watched]
    return Section("hang", f"Hang check: job {job}", data,
                   live_findings(views, window_s, multi_node, label_job) + unread)


def job_row(job: str, views: list[RankView], section: Section | None) -> dict[str, Any]:
    problems = [f for f in (section.findings if section else [])
                if f.status in (Status.WARN, Status.FAIL)]
    badge = section.verdict() if section is not None else None
    verdict = "not watched" if section is None else badge.value if badge else "n/a"
    return {"job": job, "ranks": len(views), "watched": sum(v.watched for v in views),
            "nodes": len({v.node_rank for v in views}), "verdict": verdict,
            "first": problems[0].check if problems else None}


def jobs_section(rows: list[dict[str, Any]]) -> Section:
    unwatched = [r["job"] for r in rows if r["verdict"] == "not watched"]
    said = f"{len(rows)} jobs seen, each judged on its own (their sections above)"
    if unwatched:  # a job never looked at is no all-clear
        finding = skip("hang.jobs", f"{said}; {len(unwatched)} not watched at all (more "
                       "rank processes than could be watched in time): not judged; give "
                       "the PIDs of the job to judge, or its launcher's PID")
    else:
        finding = ok("hang.jobs", said)
    return Section("hang", f"Hang check: {len(rows)} jobs", {"jobs": rows}, [finding])


def armed(views: list[RankView]) -> Finding:
    """Whether the job leaves Flight Recorder dumps, from its allowlisted variables."""
    prefixes = {v.env.get("TORCH_FR_DUMP_TEMP_FILE") or v.env.get(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") for v in views}
    prefixes.discard(None)
    if prefixes:
        return ok("hang.traces.armed", "the job is armed: Flight Recorder dumps go to "
                  f"{', '.join(sorted(p for p in prefixes if p))}<rank>; read them with "
                  "gpucheck hang --traces DIR")
    return skip("hang.traces.armed", "no Flight Recorder dumps will be written for this job: "
                f"next time, {ARM}")
