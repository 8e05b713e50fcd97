"""Rank 0's go/no-go: the owning commands judge the gathered figures; this names the
failing nodes and decides. A WARN never condemns a node, nor stops the job unless
`--strict`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck import subject as subjects
from gpucheck.distributed.nodes import NodeId, group_by_node
from gpucheck.report import Finding, Section, Status, fail, ok, skip, warn

NODE_HINT = ("keep this node out of the job (resubmit with the exclude file: sbatch "
             "--exclude, or drain it with --drain), then have it checked: gpucheck "
             "health, nvidia-smi -q, dcgmi diag -r 3")
STRESS_KEEP = ("gemm", "sdc")


def decide(result: Mapping[str, Any]) -> dict[str, Any]:
    """{go, failing: [node rows], sections: [section dicts]} from rank 0's result."""
    sections, failing = judged_sections(result)
    strict = bool(result.get("strict"))
    worst = max((f.status.severity for s in sections for f in s.findings), default=0)
    bound = Status.WARN.severity if strict else Status.FAIL.severity
    go = worst < bound and not failing  # a node named to fail stops the job whatever else
    head = verdict_section(result, failing, go)
    return {"go": go, "failing": failing,
            "sections": [s.to_dict() for s in (head, *sections)]}


def judged_sections(result: Mapping[str, Any]) -> tuple[list[Section], list[dict[str, Any]]]:
    """Each check's section, and the nodes its FAILs name."""
    ranks, checks = result["ranks"], result["checks"]
    done = {name for name, entry in checks.items() if entry.get("state") == "done"}
    judged: list[tuple[Section | None, list[dict[str, Any]]]] = [
        (budget_section(checks, bool(result.get("strict"))), [])]
    if "nvml" in done:
        judged.append(nvml_section(checks["nvml"]["nodes"], ranks))
    stress = result.get("stress")
    if stress:
        judged += [(s, []) for s in stress_sections_kept(stress, result)]
        judged.append((None, [_blame(ranks, r, "preflight.sdc", why)
                              for r, why in sdc_wrong_ranks(stress).items()]))
    if "alloc" in done:
        judged.append(alloc_section(checks["alloc"]["ranks"], ranks))
    if "all_reduce" in done:
        judged.append((all_reduce_section(checks["all_reduce"]["row"]), []))
        if checks["all_reduce"].get("nodes") is not None:
            judged.append(node_all_reduce_section(checks["all_reduce"]["nodes"], result))
    if "links" in done and checks["links"].get("internode"):
        judged.append(links_section(checks["links"]["internode"], result))
    if result.get("faults") is not None:
        from gpucheck.stress.report import faults_of

        section = faults_of(result)
        judged.append((section, [_blame(ranks, r, "preflight.faults", why)
                                 for r, why in fault_ranks(section.data.get("gpus") or [])]))
    return ([s for s, _ in judged if s is not None],
            failing_nodes([b for _, bad in judged for b in bad]))


def fault_ranks(gpus: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(rank, why) for each rank on a GPU whose fault verdict is FAIL."""
    found = []
    for gpu in gpus:
        if gpu.get("verdict") != Status.FAIL.value:
            continue
        for rank in str(gpu.get("ranks") or "").split(","):
            if rank.strip().isdigit():
                found.append((int(rank), f"a hardware fault during the checks on "
                              f"{gpu.get('gpu')} (action {gpu.get('action')})"))
    return found


def _blame(ranks: Sequence[Mapping[str, Any]], rank: int, check: str,
           why: str) -> dict[str, Any]:
    info = next((r for r in ranks if int(r["rank"]) == rank), {})
    return {"host": str(info.get("host", "?")), "node_rank": int(info.get("node_rank", -1)),
            "rank": rank, "gpu": info.get("device"), "check": check, "why": why}


def failing_nodes(blamed: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per failing node: its host, the ranks and GPUs to blame, why."""
    nodes: dict[tuple[int, str], dict[str, Any]] = {}
    for b in blamed:
        row = nodes.setdefault((b["node_rank"], b["host"]), {
            "host": b["host"], "node_rank": b["node_rank"], "ranks": [], "gpus": [],
            "checks": [], "why": []})
        for key, value in (("ranks", b.get("rank")), ("gpus", b.get("gpu")),
                           ("checks", b["check"]), ("why", b["why"])):
            if value is not None and value not in row[key]:
                row[key].append(value)
    return [nodes[k] for k in sorted(nodes)]


def budget_section(checks: Mapping[str, Any], strict: bool) -> Section:
    """Each check: done, not applicable, or unfinished within the budget."""
    findings = []
    for name, entry in checks.items():
        if entry.get("state") != "unfinished":
            continue
        text = f"{name}: not run within the budget ({entry['reason']})"
        findings.append(fail("preflight.budget", text, "give a larger --budget, or drop "
                             "--strict to let the job start without it",
                             subject=subjects.text(name))
                        if strict else skip("preflight.budget", text, subject=subjects.text(name)))
    states = {name: entry.get("state") for name, entry in checks.items()}
    if not findings:
        findings.append(ok("preflight.budget", f"{len(states)} check(s) within the budget"))
    return Section("budget", "Checks within the budget", {"checks": states}, findings)


def nvml_section(nodes: Sequence[Mapping[str, Any]], ranks: Sequence[Mapping[str, Any]],
                 ) -> tuple[Section, list[dict[str, Any]]]:
    """env's NVML findings per node, each subject prefixed with its node."""
    labels = {n.node_rank: n.label for n in group_by_node(ranks)}
    hosts = {n.node_rank: n.host for n in group_by_node(ranks)}
    findings, blamed = [], []
    for node in nodes:
        label = labels.get(int(node["node_rank"]), f"node {node['node_rank']}")
        for raw in node["findings"]:
            finding = Finding.from_dict(raw)
            index, host = int(node["node_rank"]), hosts.get(int(node["node_rank"]))
            subject = (finding.subject.on_node(index, f"{label} {finding.subject}", host)
                       if finding.subject else subjects.node(index, label, host=host))
            findings.append(Finding(finding.check, finding.status, finding.message,
                                    finding.hint, subject, cause=finding.cause,
                                    look=finding.look))
            if finding.status is Status.FAIL:
                blamed.append({"host": host or "?", "node_rank": index, "check": finding.check,
                               "gpu": finding.subject and finding.subject.label,
                               "why": finding.message})
    return Section("nvml", "GPU health through NVML (env's judges), per node",
                   {"nodes": [n["node_rank"] for n in nodes]}, findings), blamed


def stress_sections_kept(stress: Mapping[str, Any], result: Mapping[str, Any]) -> list[Section]:
    from gpucheck.stress.report import Verdicts, stress_sections

    fractions = result.get("fractions") or {}
    verdicts = Verdicts(fractions.get("peer", 0.5), fractions.get("expected", 0.8), 0.6)
    return [s for s in stress_sections(stress, verdicts) if s.name in STRESS_KEEP]


def sdc_wrong_ranks(stress: Mapping[str, Any]) -> dict[int, str]:
    """Ranks whose product was wrong (gpucheck.agreement.judge)."""
    from gpucheck.agreement import judge

    sdc = stress.get("sdc")
    if not sdc:
        return {}
    records = list(sdc["records"])
    deviations = sdc.get("reference_deviations") or [None] * len(records)
    nodes = {int(r["rank"]): int(r["node_rank"]) for r in stress.get("ranks") or []
             if "node_rank" in r}
    verdict = judge({int(r["rank"]): r["digest"] for r in records},
                    {int(r["rank"]): d for r, d in zip(records, deviations, strict=True)},
                    sdc["tolerance"], {int(r["rank"]): r["group"] for r in records},
                    nodes, splits=True)
    # Every rank wrong alike is the software (torch, cuBLAS, the driver), as stress
    # says: the job stops on its FAIL, but no node is condemned for it.
    wrong = {} if len(verdict.wrong) == len(records) > 1 else dict(verdict.wrong)
    for r in records:
        if r["bad_iters"]:
            wrong.setdefault(int(r["rank"]), f"its product changed in {r['bad_iters']} of "
                             f"{r['iters']} repetitions")
    return wrong


def alloc_section(rows: Sequence[Mapping[str, Any]], ranks: Sequence[Mapping[str, Any]],
                  ) -> tuple[Section, list[dict[str, Any]]]:
    findings, blamed = [], []
    for row in rows:
        if row["ok"]:
            continue
        why = f"could not allocate {row['bytes']} bytes in one piece: {row['error']}"
        findings.append(fail("preflight.alloc", f"rank {row['rank']}: {why}", NODE_HINT,
                             subject=subjects.rank(int(row["rank"]))))
        blamed.append(_blame(ranks, int(row["rank"]), "preflight.alloc", why))
    if not findings:
        findings.append(ok("preflight.alloc", f"{len(rows)} rank(s) allocated and wrote "
                           f"{min(int(r['bytes']) for r in rows)} bytes or more in one piece"))
    return Section("alloc", "One large allocation per rank", {"ranks": list(rows)},
                   findings), blamed


def all_reduce_section(row: Mapping[str, Any]) -> Section:
    from gpucheck.comm.verdicts import correctness_findings

    table = {k: v for k, v in row.items() if k != "rank_times_us"}
    return Section("all_reduce", "Job-wide all_reduce", {"result": table,
                   "rank_times_us": row.get("rank_times_us")},
                   correctness_findings("all_reduce", [row]))


def node_all_reduce_section(nodes: Mapping[str, Any], result: Mapping[str, Any],
                            ) -> tuple[Section, list[dict[str, Any]]]:
    """Each node's own all_reduce busbw, confirmed before condemning (node_busbw)."""
    from gpucheck.preflight.node_busbw import node_findings

    figures = {int(k): v for k, v in (nodes.get("figures") or {}).items()}
    again = nodes.get("again")
    again = None if again is None else {int(k): v for k, v in again.items()}
    ids = {n.node_rank: n for n in group_by_node(result["ranks"])}
    findings, condemned = node_findings(
        figures, nodes.get("plan") or {"suspects": {}, "known_good": None}, again,
        nodes.get("why_not"), {k: v.label for k, v in ids.items()}, result["device"])
    blamed = [{"host": ids[n].host if n in ids else "?", "node_rank": n,
               "check": "preflight.node_all_reduce",
               "why": "its own all_reduce bus bandwidth is low, confirmed when measured "
                      "again"} for n in condemned]
    data = {"figures": figures, "again": again, "plan": nodes.get("plan")}
    return Section("node_all_reduce", "Each node's own all_reduce (busbw)", data,
                   findings), blamed


def links_section(internode: Mapping[str, Any], result: Mapping[str, Any],
                  ) -> tuple[Section, list[dict[str, Any]]]:
    """comm's node-to-node verdicts; a node confirmed slow fails on GPU ranks."""
    from gpucheck.comm.report import Verdicts, comm_sections

    fraction = (result.get("fractions") or {}).get("link", 0.5)
    comm_result = {"world_size": result["world_size"], "device": result["device"],
                   "backend": result["backend"], "iters": internode["iters"], "warmup": 1,
                   "ranks": result["ranks"], "collectives": {}, "internode": internode,
                   "transport": [], "faults": []}
    section = next(s for s in comm_sections(comm_result, Verdicts(fraction, None, 0.9))
                   if s.name == "internode")
    nodes = list(group_by_node(result["ranks"]))
    blamed = []
    for index in confirmed_slow_nodes(section.findings):
        node: NodeId = nodes[index]
        why = "its node-to-node links are slow, confirmed against a known-good node"
        if result["device"] == "cuda":
            blamed.append({"host": node.host, "node_rank": node.node_rank,
                           "check": "preflight.links", "why": why})
            section.findings.append(fail("preflight.links", f"{node.label}: {why}",
                                         NODE_HINT, subject=node.subject()))
    return section, blamed


def confirmed_slow_nodes(findings: Sequence[Finding]) -> list[int]:
    """The nodes comm's internode findings name slow with a confirmed second look (every
    slow pair of theirs slow again beside a known-good pair)."""
    from gpucheck.measure import LookState

    return sorted({f.subject.node for f in findings
                   if f.check == "comm.internode.shared_node" and f.look is not None
                   and f.look.state is LookState.CONFIRMED
                   and f.subject is not None and f.subject.node is not None})


def verdict_section(result: Mapping[str, Any], failing: Sequence[Mapping[str, Any]],
                    go: bool) -> Section:
    """The decision first: go, or each failing node with its ranks and GPUs."""
    findings: list[Finding] = []
    for node in failing:
        label = f"node {node['node_rank']} ({node['host']})"
        where = ", ".join(f"rank {r}" for r in node["ranks"]) or "the node"
        gpus = f" on {', '.join(map(str, node['gpus']))}" if node["gpus"] else ""
        findings.append(fail("preflight.node", f"{label}: {where}{gpus}: "
                             f"{'; '.join(node['why'])}", NODE_HINT,
                             subject=subjects.node(int(node["node_rank"]), node["host"],
                                                   host=node["host"])))
    if go:
        then = "the command starts on every rank" if result.get("command_given", True) \
            else "no command was given, so none starts (a check only)"
        findings.append(ok("preflight.go", f"{result['world_size']} rank(s) on "
                           f"{len(group_by_node(result['ranks']))} node(s) passed: {then}"))
    elif not failing:
        findings.append(warn("preflight.no_go", "the checks failed without naming a node "
                             "(see the sections below): the command starts on no rank",
                             "read the FAIL findings below"))
    data = {"go": go, "failing_nodes": list(failing), "budget_s": result.get("budget_s")}
    return Section("preflight", "Preflight: go / no-go", data, findings)
