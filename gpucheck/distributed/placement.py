"""`ranks.numa`: does each rank run on CPUs of its GPU's NUMA node? From the check-in
records (`gpucheck.distributed.checkin.RankInfo`: cpus, numa_node, on_gpu_numa), so
bench, comm and stress judge it the same way.

A rank whose CPUs are all on another node than its GPU's sends every kernel launch
and pinned host copy across the socket interconnect (`nvidia-smi topo -m` shows which
CPUs are near each GPU). Only that case is a WARN: a rank with CPUs on both sides is
not pinned (torchrun's default), which is the scheduler's choice, not a fault; a GPU
whose NUMA node is -1 (most VMs, single-socket boards) or a one-node machine has
nothing to judge, and CPU ranks have no GPU to be near.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import device_label
from gpucheck.numa import cpulist
from gpucheck.report import Finding, ok, warn

CHECK = "ranks.numa"


def numa_findings(ranks: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A WARN per rank with no CPU on its GPU's NUMA node; one OK naming the ranks that run
    only on it; nothing when no rank can be judged (see the module's docstring)."""
    findings = [_off_node(r) for r in ranks if r.get("on_gpu_numa") is False]
    near = tuple(int(r["rank"]) for r in ranks if r.get("on_gpu_numa") is True)
    if near:
        findings.append(ok(CHECK, f"rank(s) {cpulist(near)} run only on CPUs of their GPU's "
                           "NUMA node"))
    return findings


def _off_node(rank: Mapping[str, Any]) -> Finding:
    node = rank.get("numa_node")
    message = (f"rank {rank['rank']} on {rank.get('host', 'its host')} runs on CPUs "
               f"{rank.get('cpus') or 'unknown'}, none of them on NUMA node {node} where its "
               "GPU is: its kernel launches and pinned host copies cross the socket "
               "interconnect")
    hint = (f"bind the rank to node {node}: numactl --cpunodebind={node} --membind={node} "
            "<command>, torchrun --numa-binding=node (recent torch: see torchrun --help), or "
            "srun --gpu-bind=closest under SLURM; gpucheck stress pins its ranks itself "
            f"(unless --no-numa-pin). If the job's cpuset (container, cgroup, SLURM "
            f"allocation) has no CPU on node {node}, widen it (taskset -cp <pid> shows it)")
    return warn(CHECK, message, hint, subjects.rank(int(rank["rank"]),
                f"rank {rank['rank']} ({device_label(rank)})"))
