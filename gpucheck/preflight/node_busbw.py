"""Each node's all_reduce bus bandwidth, judged against the model's expected figure and
against the other nodes, measured again before it condemns.

The per-node figure: an all_reduce among each node's own ranks, every node at once
(its own process group), after the job-wide one. The job-wide all_reduce gives one
figure for the whole job, set by its slowest link: it cannot say which node is slow,
and the links between nodes are already judged node by node (`links`). What is left
is each node's own fabric (NVLink / NVSwitch, or PCIe): the figure the field checks
per node (Azure's node health checks run an 8-GPU all_reduce per node and fail it
below a busbw floor). A node with one rank has no such figure (its links are the
`links` check's). One node alone: its figure is the job's, measured on its ranks.

busbw as nccl-tests reports it: size / time x 2(n-1)/n, with the time of the slowest
rank of the node (gpucheck.comm.aggregate).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.distributed.deadline import synchronize
from gpucheck.distributed.session import barrier
from gpucheck.measure import Better, Bound, LookState, SecondLook
from gpucheck.peers import SLOW_NODE_FRACTION, against_median, known_good, second_look
from gpucheck.preflight.budget import GRACE_S
from gpucheck.report import Finding, Status, looked, ok, skip

CHECK = "preflight.node_all_reduce"
UNIT = "GB/s"
HINT = ("check the node's NVLink / NVSwitch (nvidia-smi nvlink -s, nvidia-smi topo -m, "
        "nvidia-smi -q -d NVLINK), then gpucheck comm on it alone")
RERUN_HINT = ("not condemned: slow once but not confirmed (or CPU ranks, whose speed is "
              "the machine's load); rerun, and look into it if it comes back")
AZURE_ND_H100_V5 = ("Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf: "
                    "check_nccl_allreduce 460.0 GB/s on 8 H100 SXM, about 480 typical")


@dataclass(frozen=True)
class Expected:
    """A healthy node's all_reduce busbw for (model, GPUs on the node), the fraction of
    it preflight's smaller message must reach, and the least size it applies from."""

    busbw_gbps: float
    fraction: float
    min_bytes: int
    source: str

    @property
    def floor_gbps(self) -> float:
        return self.busbw_gbps * self.fraction


# Only what a source gives. 480 GB/s is for large messages (GBs); preflight sends
# 256 MiB, where a healthy HGX reaches less, so only half of it is required: a node
# with an NVLink down or an NVSwitch degraded falls far below that (to PCIe rates),
# a healthy one stays well above (an estimate until measured on a device).
EXPECTED: dict[tuple[str, int], Expected] = {
    ("NVIDIA H100 80GB HBM3", 8): Expected(480.0, 0.5, 256 << 20,
                                           AZURE_ND_H100_V5 + "; half of it required at "
                                           "256 MiB (estimate, docs/preflight.md)"),
}


def expected_for(model: str | None, gpus: int, size_bytes: int) -> Expected | None:
    found = EXPECTED.get(((model or "").strip(), gpus))
    return found if found is not None and size_bytes >= found.min_bytes else None


def node_figures(records: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """{node_rank: {busbw_gbps, ranks, model, size_bytes}} from every rank's record
    ({rank, node_rank, model, size_bytes, time_s}); nodes with one rank have none."""
    by_node: dict[int, list[Mapping[str, Any]]] = {}
    for rec in records:
        by_node.setdefault(int(rec["node_rank"]), []).append(rec)
    out = {}
    for node, recs in sorted(by_node.items()):
        n, slowest = len(recs), max(float(r["time_s"]) for r in recs)
        if n < 2 or slowest <= 0:
            continue
        size = int(recs[0]["size_bytes"])
        models = {r.get("model") for r in recs}
        out[node] = {"busbw_gbps": size / slowest * 2 * (n - 1) / n / 1e9, "ranks": n,
                     "model": models.pop() if len(models) == 1 else None,
                     "size_bytes": size}
    return out


def plan(figures: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Suspects ({node: [reasons]}: "peers", "expected") and the known-good node to
    measure beside them; rank 0 makes it, every rank follows it."""
    values = {n: float(f["busbw_gbps"]) for n, f in figures.items()}
    peers = against_median(values, Bound.fraction(SLOW_NODE_FRACTION, Better.HIGHER))
    suspects: dict[int, list[str]] = {n: ["peers"] for n in peers.worse}
    for n, f in figures.items():
        exp = expected_for(f.get("model"), int(f["ranks"]), int(f["size_bytes"]))
        if exp is not None and values[n] < exp.floor_gbps:
            suspects.setdefault(n, []).append("expected")
    good = known_good(values, list(suspects)) if suspects else None
    return {"suspects": suspects, "known_good": good}


def looks(figures: Mapping[int, Mapping[str, Any]], wanted: Mapping[str, Any],
          again: Mapping[int, Mapping[str, Any]] | None,
          why_not: str | None) -> dict[int, list[tuple[str, SecondLook]]]:
    """Each suspect's second look per reason: against the known-good node measured
    again beside it (peers), against the expected floor (expected)."""
    out: dict[int, list[tuple[str, SecondLook]]] = {}
    good = wanted.get("known_good")
    for node, reasons in wanted["suspects"].items():
        node = int(node)
        first = float(figures[node]["busbw_gbps"])
        now = None if again is None or node not in again else float(again[node]["busbw_gbps"])
        for reason in reasons:
            if reason == "peers":
                ref = None if again is None or good is None or good not in again else \
                    float(again[good]["busbw_gbps"])
                bound = Bound.fraction(SLOW_NODE_FRACTION, Better.HIGHER)
                against: tuple[Any, ...] = () if good is None else (subject.node(good),)
            else:
                f = figures[node]
                exp = expected_for(f.get("model"), int(f["ranks"]), int(f["size_bytes"]))
                ref, bound, against = (exp.floor_gbps if exp else None,
                                       Bound.fraction(1.0, Better.HIGHER), ())
            out.setdefault(node, []).append(
                (reason, second_look(first, now, ref, against, bound, UNIT, why_not)))
    return out


def node_findings(figures: Mapping[int, Mapping[str, Any]], wanted: Mapping[str, Any],
                  again: Mapping[int, Mapping[str, Any]] | None, why_not: str | None,
                  labels: Mapping[int, str], device: str,
                  ) -> tuple[list[Finding], list[int]]:
    """The findings, and the nodes condemned: only a CONFIRMED look on GPU ranks, a
    FAIL (a CPU rank's speed is the machine's load: WARN, rerun, never a drain); an
    unstable look is an OK (`gpucheck.report.looked`)."""
    if not figures:
        return [skip(CHECK, "no node has two ranks or more: no intra-node all_reduce "
                     "(the links between nodes are the links check's)")], []
    findings: list[Finding] = []
    condemned: list[int] = []
    for node, node_looks in sorted(looks(figures, wanted, again, why_not).items()):
        label = subject.node(node, labels.get(node))
        for reason, look in node_looks:
            text = _look_text(label, reason, look)
            if look.state is LookState.CONFIRMED and device == "cuda":
                findings.append(looked(CHECK, text, HINT, label, look, status=Status.FAIL))
                condemned.append(node)
            else:
                findings.append(looked(CHECK, text, RERUN_HINT, label, look,
                                       cause=None if device == "cuda" else "cpu_ranks"))
    if not any(f.status in (Status.WARN, Status.FAIL) for f in findings):
        findings.append(ok(CHECK, _healthy_text(figures)))
    return findings, sorted(set(condemned))


def _look_text(label: str, reason: str, look: SecondLook) -> str:
    what = (f"below {SLOW_NODE_FRACTION:g} x the known-good node's" if reason == "peers"
            else "below the expected floor of")
    ref = "?" if look.reference is None else f"{look.reference:.3g}"
    again = "not measured again" if look.again is None else f"again {look.again:.3g}"
    state = look.state.value if look.why_not is None else f"{look.state.value}: " \
        f"{look.why_not}"
    return (f"{label}: all_reduce busbw {look.first:.3g} {UNIT} ({again}), {what} "
            f"{ref} {UNIT} ({state})")


def _healthy_text(figures: Mapping[int, Mapping[str, Any]]) -> str:
    values = ", ".join(f"node {n} {f['busbw_gbps']:.3g}" for n, f in sorted(figures.items()))
    expected = [expected_for(f.get("model"), int(f["ranks"]), int(f["size_bytes"]))
                for f in figures.values()]
    against = "their expected floor and " if all(expected) else \
        "the other nodes (no expected figure for this GPU model, GPU count and size; " \
        "gpucheck lists only sourced ones) and "
    return (f"{len(figures)} node(s) within {against}{SLOW_NODE_FRACTION:g} x the median "
            f"node: {values} {UNIT}")


# --- measured: every rank of every node at once, in its node's own group ---


def measure_nodes(world: Any, roster: Sequence[Mapping[str, Any]], device: str,
                  size_bytes: int, iters: int, budget: Any) -> dict[str, Any]:
    """Every node's all_reduce among its own ranks (first pass, and a second pass of
    every node at once when rank 0's plan names a suspect and the budget allows), as
    {figures, plan, again, why_not}; every rank returns the same."""
    import torch.distributed as dist

    nodes: dict[int, list[int]] = {}
    for r in roster:
        nodes.setdefault(int(r["node_rank"]), []).append(int(r["rank"]))
    # Each node's own group (torch.distributed.new_subgroups_by_enumeration: every rank
    # takes part in creating each); torn down with the rest by the frame's
    # destroy_process_group. One node: the job's own group.
    group = None if len(nodes) == 1 else \
        dist.new_subgroups_by_enumeration([sorted(v) for _, v in sorted(nodes.items())])[0]
    figures = _pass(world, device, size_bytes, iters, group, budget)
    box: list[Any] = [plan(figures) if world.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    wanted, again, why_not = box[0], None, None
    if wanted["suspects"]:
        cost = 1.0 + 2 * max(_seconds(figures), 0.1)
        if budget.agreed_left(device) >= cost:
            budget.bound_waits()
            again = _pass(world, device, size_bytes, iters, group, budget)
        else:
            why_not = f"no {cost:.2g} s left of the budget to measure it again"
    return {"figures": figures, "plan": wanted, "again": again, "why_not": why_not}


def _seconds(figures: Mapping[int, Mapping[str, Any]]) -> float:
    return max((f["size_bytes"] / (f["busbw_gbps"] * 1e9) for f in figures.values()
                if f["busbw_gbps"] > 0), default=0.0)


def _pass(world: Any, device: str, size_bytes: int, iters: int, group: Any,
          budget: Any) -> dict[int, dict[str, Any]]:
    import torch.distributed as dist

    # Every host wait on NCCL under gpucheck's deadline: the budget's end and its grace.
    record = _timed(world, device, size_bytes, iters, group, budget.left_here() + GRACE_S)
    every: list[Any] = [None] * world.world_size
    dist.all_gather_object(every, record)
    return node_figures(every)


def _timed(world: Any, device: str, size_bytes: int, iters: int, group: Any,
           wait_s: float) -> dict[str, Any]:
    """This rank's mean all_reduce time in its node's group (2 warm-ups, then `iters`,
    between barriers of the group), no host wait past `wait_s` each."""
    import torch
    import torch.distributed as dist

    where = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    data = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=where)
    for _ in range(2):
        dist.all_reduce(data, group=group)
    synchronize(device, wait_s, "the node all_reduce's warm-up")
    barrier(wait_s, group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data, group=group)
    synchronize(device, wait_s, "the node all_reduce")
    seconds = (time.perf_counter() - start) / max(1, iters)
    model = torch.cuda.get_device_name() if device == "cuda" else None
    return {"rank": world.rank, "node_rank": world.node_rank, "model": model,
            "size_bytes": data.numel() * 4, "time_s": seconds}
