"""Each node's own all_reduce bus bandwidth (its ranks in a group of their own, every
node at once), judged against the model's expected floor and the other nodes, and
measured again before it condemns (docs/preflight.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.confirm import Suspect, confirm, remeasure
from gpucheck.context import RunContext
from gpucheck.distributed.deadline import gather_objects
from gpucheck.distributed.session import barrier
from gpucheck.measure import Better, Bound
from gpucheck.peers import SLOW_NODE_FRACTION, against_median, known_good
from gpucheck.preflight.actions import GRACE_S
from gpucheck.report import Finding, Status, ok, skip
from gpucheck.timing import Marks

CHECK = "preflight.node_all_reduce"
UNIT = "GB/s"
HINT = ("check the node's NVLink / NVSwitch (nvidia-smi nvlink -s, nvidia-smi topo -m, "
        "nvidia-smi -q -d NVLINK), then gpucheck comm on it alone")
RERUN_HINT = ("not condemned: slow once but not confirmed (or CPU ranks, whose speed is "
              "the machine's load); rerun, and look into it if it comes back")


@dataclass(frozen=True)
class Expected:
    """A healthy node's all_reduce busbw, the share of it preflight's message must reach,
    and the least size it applies from."""

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
    ("NVIDIA H100 80GB HBM3", 8): Expected(
        480.0, 0.5, 256 << 20, "Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf: "
        "check_nccl_allreduce 460.0 GB/s on 8 H100 SXM, about 480 typical; half of it "
        "required at 256 MiB (estimate, docs/preflight.md)"),
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
    measure beside them."""
    values = {n: float(f["busbw_gbps"]) for n, f in figures.items()}
    peers = against_median(values, Bound.fraction(SLOW_NODE_FRACTION, Better.HIGHER))
    suspects: dict[int, list[str]] = {n: ["peers"] for n in peers.worse}
    for n, f in figures.items():
        exp = _expected(f)
        if exp is not None and values[n] < exp.floor_gbps:
            suspects.setdefault(n, []).append("expected")
    good = known_good(values, list(suspects)) if suspects else None
    return {"suspects": suspects, "known_good": good}


def node_findings(figures: Mapping[int, Mapping[str, Any]], wanted: Mapping[str, Any],
                  again: Mapping[int, Mapping[str, Any]] | None, why_not: str | None,
                  labels: Mapping[int, str], device: str,
                  ) -> tuple[list[Finding], list[int]]:
    """The findings, each suspect's with its second look per reason (beside the known-good
    node, or against the expected floor), and the nodes condemned (a FAIL: confirmed on
    GPU ranks; on CPU ranks the machine's load, `cpu_ranks`, a WARN)."""
    if not figures:
        return [skip(CHECK, "no node has two ranks or more: no intra-node all_reduce "
                     "(the links between nodes are the links check's)")], []
    findings: list[Finding] = []
    good = wanted.get("known_good")
    cause = None if device == "cuda" else "cpu_ranks"
    for node, reasons in sorted((int(n), r) for n, r in wanted["suspects"].items()):
        label = subject.node(node, labels.get(node))
        first, now = float(figures[node]["busbw_gbps"]), _busbw(again, node)
        text = f"{label}: all_reduce busbw {first:.3g} {UNIT}, below "
        for reason in reasons:
            if reason == "peers":
                suspect = Suspect(label, text + f"{SLOW_NODE_FRACTION:g} x the known-good "
                                  "node's", first, now, _busbw(again, good),
                                  () if good is None else (subject.node(good),), why_not)
                bound = Bound.fraction(SLOW_NODE_FRACTION, Better.HIGHER)
            else:
                exp = _expected(figures[node])
                suspect = Suspect(label, text + "the expected floor", first, now,
                                  exp.floor_gbps if exp else None, (), why_not)
                bound = Bound.fraction(1.0, Better.HIGHER)
            findings += confirm(CHECK, [suspect], bound, UNIT, RERUN_HINT, cause=cause,
                                fail_hint=HINT)
    if not any(f.status in (Status.WARN, Status.FAIL) for f in findings):
        findings.append(ok(CHECK, _healthy_text(figures)))
    return findings, sorted({f.subject.node for f in findings if f.status is Status.FAIL
                             and f.subject is not None and f.subject.node is not None})


def _busbw(again: Mapping[int, Mapping[str, Any]] | None, node: int | None) -> float | None:
    found = None if again is None or node is None else again.get(node)
    return None if found is None else float(found["busbw_gbps"])


def _expected(figure: Mapping[str, Any]) -> Expected | None:
    return expected_for(figure.get("model"), int(figure["ranks"]), int(figure["size_bytes"]))


def _healthy_text(figures: Mapping[int, Mapping[str, Any]]) -> str:
    values = ", ".join(f"node {n} {f['busbw_gbps']:.3g}" for n, f in sorted(figures.items()))
    against = "their expected floor and " if all(map(_expected, figures.values())) else \
        "the other nodes (no expected figure for this GPU model, GPU count and size; " \
        "gpucheck lists only sourced ones) and "
    return (f"{len(figures)} node(s) within {against}{SLOW_NODE_FRACTION:g} x the median "
            f"node: {values} {UNIT}")


# --- measured: every rank of every node at once, in its node's own group ---


def measure_nodes(world: Any, roster: Sequence[Mapping[str, Any]], device: str,
                  size_bytes: int, iters: int, budget: Any, ctx: RunContext) -> dict[str, Any]:
    """Every node's all_reduce among its own ranks, then every node again at once when
    rank 0's plan names a suspect and the budget allows: {figures, plan, again, why_not},
    the same on every rank."""
    import torch.distributed as dist

    nodes: dict[int, list[int]] = {}
    for r in roster:
        nodes.setdefault(int(r["node_rank"]), []).append(int(r["rank"]))
    # Each node's own group (every rank takes part in creating each); torn down with the
    # rest by the frame's destroy_process_group. One node: the job's own group.
    group = None if len(nodes) == 1 else \
        dist.new_subgroups_by_enumeration([sorted(v) for _, v in sorted(nodes.items())])[0]
    figures = _pass(world, device, size_bytes, iters, group, budget, ctx)
    slowest = max((f["size_bytes"] / (f["busbw_gbps"] * 1e9) for f in figures.values()
                   if f["busbw_gbps"] > 0), default=0.0)
    cost = 1.0 + 2 * max(slowest, 0.1)

    def again(wanted: dict[str, Any]) -> tuple[Any, str | None]:
        if not wanted["suspects"]:
            return None, None
        if budget.agreed_left(device) < cost:
            return None, f"no {cost:.2g} s left of the budget to measure it again"
        budget.bound_waits()
        return _pass(world, device, size_bytes, iters, group, budget, ctx), None

    found = remeasure(world.rank, lambda: plan(figures), again, ctx)  # (plan, (again, why not))
    measured, why_not = found[1] or (None, None)
    return {"figures": figures, "plan": found[0], "again": measured, "why_not": why_not}


def _pass(world: Any, device: str, size_bytes: int, iters: int, group: Any,
          budget: Any, ctx: RunContext) -> dict[int, dict[str, Any]]:
    """This rank's mean all_reduce time in its node's group (2 warm-ups, then `iters`
    between barriers of the group), every host wait under the budget's end and its
    grace; every rank's figures."""
    import torch
    import torch.distributed as dist

    wait_s = budget.left_here() + GRACE_S
    where = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    data = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=where)
    for _ in range(2):
        dist.all_reduce(data, group=group)
    marks = Marks(device, host=True)
    marks.wait(wait_s, "the node all_reduce's warm-up")
    barrier(wait_s, group)
    marks.mark()
    for _ in range(iters):
        dist.all_reduce(data, group=group)
    marks.wait(wait_s, "the node all_reduce")
    marks.mark()
    model = torch.cuda.get_device_name() if device == "cuda" else None
    record = {"rank": world.rank, "node_rank": world.node_rank, "model": model,
              "size_bytes": data.numel() * 4, "time_s": marks.span_s() / max(1, iters)}
    every: list[Any] = gather_objects(record, ctx)
    return node_figures(every)
