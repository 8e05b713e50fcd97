"""This node's view of its rank processes, and the report built from every node's.

`node_view` runs on one node (found ranks watched, missing local ranks added as dead)
and returns plain values, so the views of several nodes can be gathered over the
distributed frame and judged together by `live_sections`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.errors import UsageError
from gpucheck.hang.findings import armed, ranks_section
from gpucheck.hang.observe import RankView, watch
from gpucheck.hang.procs import Discovery, RankProcess, discover, missing_local_ranks
from gpucheck.report import Section, skip


def _dead_views(ranks: list[RankProcess], host: str) -> list[RankView]:
    views = []
    for rank, local in missing_local_ranks(ranks):
        if rank is not None:
            views.append(RankView(rank, local, ranks[0].world_size, None, host,
                                  state="exited", state_start="exited"))
    return views


def _notes(found: Discovery) -> list[str]:
    notes = []
    if found.gone:
        notes.append(f"PID(s) {', '.join(map(str, found.gone))} no longer exist")
    if found.denied:
        notes.append(f"{found.denied} process(es) whose environment could not be read "
                     "(another user's: run as that user or root)")
    return notes


def check_pids(pids: Sequence[int] | None, found: Discovery) -> None:
    """Usage errors: PIDs given that are no rank and lead to none."""
    if not pids:
        return
    if found.not_ranks:
        raise UsageError(f"PID {found.not_ranks[0]} is neither a torch.distributed rank "
                         "(no RANK and WORLD_SIZE in its environment) nor a launcher of "
                         "ranks (torchrun); give rank PIDs or torchrun's PID")
    if not found.jobs and len(found.gone) == len(pids):
        raise UsageError(f"no process with PID {', '.join(map(str, pids))}: give the PIDs "
                         "of running ranks (or none, to find them all)")


def node_view(pids: Sequence[int] | None, window_s: float, host: str, node_rank: int,
              nvml_timeout_s: float) -> dict[str, Any]:
    """{jobs: {job: [view dicts]}, notes, gpu_note} of this node."""
    found = discover(pids or None)
    check_pids(pids, found)
    jobs: dict[str, list[dict[str, Any]]] = {}
    gpu_notes = set()
    for job, ranks in found.jobs.items():
        views, gpu_note = watch(ranks, host, window_s, nvml_timeout_s)
        if gpu_note:
            gpu_notes.add(gpu_note)
        for view in views + _dead_views(ranks, host):
            view.node_rank = node_rank
            jobs.setdefault(job, []).append(view.to_dict())
    return {"jobs": jobs, "notes": _notes(found) + sorted(gpu_notes)}


def live_sections(nodes: Mapping[int, Mapping[str, Any]], window_s: float) -> list[Section]:
    """One section per job, every node's ranks of it judged together."""
    jobs: dict[str, list[RankView]] = {}
    notes: list[str] = []
    for node_rank, view in sorted(nodes.items()):
        prefix = f"node {node_rank}: " if len(nodes) > 1 else ""
        notes.extend(prefix + n for n in view.get("notes", []))
        for job, raw in view.get("jobs", {}).items():
            jobs.setdefault(job, []).extend(RankView(**r) for r in raw)
    if not jobs:
        finding = skip("hang.discovery", "no torch.distributed rank process found (none "
                       "has RANK and WORLD_SIZE, or SLURM_PROCID, in its environment)")
        return [Section("hang", "Hang check", {"notes": notes}, [finding])]
    sections = []
    for job, views in sorted(jobs.items()):
        views.sort(key=lambda v: v.rank)
        section = ranks_section(job, views, window_s, len(nodes) > 1, notes)
        section.findings.append(armed(views))
        sections.append(section)
    return sections
