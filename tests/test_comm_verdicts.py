"""Every comm verdict on handmade figures (GB/s, microseconds, large against noise),
through the report's own path (`comm_sections`): check, status, subject and action as
main at 3533bd6 gave them (issue 25, S3), with the second look and the cause as data."""

from __future__ import annotations

from typing import Any

import pytest

from gpucheck.comm.records import read_comm
from gpucheck.comm.report import Verdicts, comm_sections
from gpucheck.comm.verdicts import node_figures, plan
from gpucheck.comm.worker import CommSpec, p2p_unsupported
from gpucheck.measure import Better, LookState
from gpucheck.report import Finding, Status

OK, SKIP, WARN = Status.OK, Status.SKIP, Status.WARN
DRAIN, RERUN = "drain-node", "rerun"
C, U, N = LookState.CONFIRMED, LookState.UNSTABLE, LookState.NOT_MEASURED
JUDGED = ("pairwise", "nodes", "internode")
Row = tuple[str, str | None, Status, str | None, LookState | None, str | None]


def _ranks(count: int, per_node: int, device: str) -> list[dict[str, Any]]:
    return [{"rank": r, "node_rank": r // per_node, "host": f"h{r // per_node}",
             "local_rank": r % per_node, "device": device} for r in range(count)]


def _result(device: str, ranks: list[dict[str, Any]], **parts: Any) -> dict[str, Any]:
    return {"world_size": len(ranks), "device": device, "backend": "gloo", "iters": 1,
            "warmup": 0, "sizes_bytes": [1024], "ranks": ranks, "collectives": {},
            "pairwise": None, "internode": None, "complete": True, "faults": []} | parts


def _pair(src: int, dst: int, samples: list[float], node: int = 0) -> dict[str, Any]:
    return {"src": src, "dst": dst, "node_rank": node, "size_bytes": 65536,
            "bandwidth_gbps": sorted(samples)[len(samples) // 2], "samples_gbps": samples}


# --- pairwise: three ranks on one node, rank 1 -> rank 0 at a fifth --------------------

def _pairwise(device: str, again: float | None) -> dict[str, Any]:
    samples = {(s, d): [10.0, 9.7, 10.2] for s in range(3) for d in range(3) if s != d}
    samples[(1, 0)] = [2.0, 2.0, 2.0]
    pairs = [_pair(s, d, v) for (s, d), v in sorted(samples.items())]
    # Every other pair measured again too (only the known-good ones nearest the median
    # are read as the reference).
    second = None if again is None else [
        _pair(s, d, [10.0, 9.8, 10.1]) for s, d in samples
        if (s, d) != (1, 0)] + [_pair(1, 0, [again] * 3)]
    return _result(device, _ranks(3, 3, device), pairwise={
        "size_bytes": 65536, "iters": 10, "repeats": 3, "pairs": pairs, "again": second})


# --- nodes: three nodes of two ranks, node 2's pairs at a fifth -------------------------

def _node_pairs(gbps: dict[int, float]) -> list[dict[str, Any]]:
    return [_pair(s, d, [gbps[s // 2]] * 3, s // 2)
            for s in range(6) for d in range(6) if s != d and s // 2 == d // 2]


def _nodes(device: str, again: float | None) -> dict[str, Any]:
    pairs = _node_pairs({0: 10.0, 1: 10.2, 2: 2.0})
    second = None if again is None else {
        "kind": "pairs", "suspects": [2], "known_good": 0,
        "pairs": [p for p in _node_pairs({0: 9.9, 1: 0.0, 2: again}) if p["src"] // 2 != 1]}
    return _result(device, _ranks(6, 2, device), nodes_again=second, pairwise={
        "size_bytes": 65536, "iters": 10, "repeats": 3, "pairs": pairs, "again": None})


def _nodes_by_time(device: str, again: float | None) -> dict[str, Any]:
    """One rank per node: the largest all_reduce's slowest time, node 2 four times slower."""
    rows = [{"size_bytes": 1024, "count": 256, "time_us": 400.0, "algbw_gbps": 1.0,
             "busbw_gbps": 1.0, "wrong": 0, "slowest_rank": 2, "fastest_time_us": 100.0,
             "rank_times_us": [100.0, 101.0, 400.0]}]
    second = None if again is None else {"kind": "all_reduce", "suspects": [2],
                                         "known_good": 1,
                                         "rank_times_us": [100.0, 99.0, again]}
    return _result(device, _ranks(3, 1, device), nodes_again=second,
                   collectives={"all_reduce": rows})


# --- between nodes: three one-rank nodes, node 2 at a tenth both ways --------------------

def _links(factor: float, slow_rail: int | None = None, rails: int = 1) -> list[dict[str, Any]]:
    links = []
    for a in range(3):
        for b in range(3):
            for rail in range(rails):
                hit = 2 in (a, b) and (slow_rail is None or rail == slow_rail)
                gbps = 10.0 * (factor if hit else 1.0)
                links.append({"round": 1, "src_node": a, "dst_node": b, "rail": rail,
                              "src": a * rails + rail, "dst": b * rails + rail,
                              "bandwidth_gbps": gbps, "samples_gbps": [gbps] * 3})
    return [x for x in links if x["src_node"] != x["dst_node"]]


def _internode(device: str, again: float | None) -> dict[str, Any]:
    return _result(device, _ranks(3, 1, device), internode={
        "size_bytes": 262144, "iters": 10, "links": _links(0.1),
        "again": None if again is None else _links(again)})


def _rails(device: str, again: float | None) -> dict[str, Any]:
    """Two rails per node; rail 1 of node 2 at a fifth both ways."""
    return _result(device, _ranks(6, 2, device), internode={
        "size_bytes": 262144, "iters": 10, "links": _links(0.2, slow_rail=1, rails=2),
        "again": None if again is None else _links(again, slow_rail=1, rails=2)})


def _healthy(device: str, again: float | None) -> dict[str, Any]:
    del again
    return _result(device, _ranks(6, 2, device), internode={
        "size_bytes": 262144, "iters": 10, "links": _links(1.0, rails=2), "again": None},
        pairwise={"size_bytes": 65536, "iters": 10, "repeats": 3,
                  "pairs": _node_pairs({0: 10.0, 1: 10.1, 2: 9.9}), "again": None})


SCENARIOS = {"pairwise": _pairwise, "nodes": _nodes, "nodes_by_time": _nodes_by_time,
             "internode": _internode, "rails": _rails, "healthy": _healthy}
# Per scenario, the figure the slow part reads when measured again (slow / fine).
SLOW_AGAIN = {"pairwise": (2.1, 9.5), "nodes": (2.1, 9.7), "nodes_by_time": (390.0, 101.0),
              "internode": (0.1, 1.0), "rails": (0.2, 1.0), "healthy": (1.0, 1.0)}


def judged(scenario: str, second: str, device: str) -> list[Finding]:
    """The findings of the judged sections (pairwise, nodes, internode), in order."""
    slow, fine = SLOW_AGAIN[scenario]
    again = {"confirmed": slow, "unstable": fine, "not_measured": None}[second]
    result = SCENARIOS[scenario](device, again)
    return [f for s in comm_sections(result, Verdicts(0.5, None, 0.9)) if s.name in JUDGED
            for f in s.findings]


def rows(scenario: str, second: str, device: str) -> list[Row]:
    return [(f.check, str(f.subject) if f.subject is not None else None, f.status,
             f.action, f.look.state if f.look is not None else None, f.cause)
            for f in judged(scenario, second, device)]


# --- what main at 3533bd6 gave (recorded), and the look and cause each now carries ------

P, NS, IP = "comm.pairwise.slow_pair", "comm.nodes.slow_node", "comm.internode.slow_pair"
IR, SN = "comm.internode.slow_rail", "comm.internode.shared_node"
LOOKED, PLAIN = "looked", "plain"  # a WARN with a second look; one without (rail majority)
NODE_PAIRS = ("node 0 -> node 2", "node 1 -> node 2", "node 2 -> node 0", "node 2 -> node 1")
RAIL_LINKS = ("rank 1 -> rank 5", "rank 3 -> rank 5", "rank 5 -> rank 1", "rank 5 -> rank 3")
NOT_BETWEEN = (IP, None, SKIP, None)  # one node, or the rounds not run: nothing between
EXPECTED: dict[str, list[tuple[str, str | None, Status, str | None]]] = {
    "pairwise": [(P, "rank 1 -> rank 0", WARN, LOOKED), NOT_BETWEEN],
    "nodes": [(P, None, OK, None), (NS, "node 2 (h2)", WARN, LOOKED), NOT_BETWEEN],
    "nodes_by_time": [(NS, "node 2 (h2)", WARN, LOOKED), NOT_BETWEEN],
    "internode": [(SN, "node 2 (h2)", WARN, LOOKED),
                  *((IP, pair, WARN, LOOKED) for pair in NODE_PAIRS)],
    "rails": [(SN, "node 2 (h2)", WARN, LOOKED), *((IP, p, WARN, LOOKED) for p in NODE_PAIRS),
              *((IR, link, WARN, LOOKED) for link in RAIL_LINKS),
              (SN, "node 2 (h2) rail 1", WARN, PLAIN)],
    "healthy": [(P, None, OK, None), (NS, None, OK, None), (IP, None, OK, None),
                (IR, None, OK, None)],
}
# The action each WARN had: drain only when confirmed on GPUs (CPU ranks: a busy
# process, rerun); not measured again and the rail majority: rerun.
BEFORE = {(LOOKED, "confirmed", "cuda"): DRAIN, (LOOKED, "confirmed", "cpu"): RERUN,
          (LOOKED, "not_measured", "cuda"): RERUN, (LOOKED, "not_measured", "cpu"): RERUN,
          **{(PLAIN, s, d): RERUN for s in ("confirmed", "not_measured")
             for d in ("cuda", "cpu")}}
STATE = {"confirmed": C, "unstable": U, "not_measured": N}
CASES = [(scenario, second, device) for scenario in EXPECTED
         for second in STATE for device in ("cuda", "cpu")]


def expected(scenario: str, second: str, device: str) -> list[Row]:
    """Check, subject, status and action as before; a look on every WARN measured again
    (its state the scenario's), cause cpu_ranks on every WARN of CPU ranks. Unstable
    (issue 36 item 4): each of them an OK keeping its look (the rail majority too: every
    link of it was fine again), and a pairwise section with no WARN opens with its OK."""
    if second == "unstable":
        return _cleared(scenario)
    found: list[Row] = []
    for check, subject, status, kind in EXPECTED[scenario]:
        action = BEFORE[(kind, second, device)] if kind else None
        look = STATE[second] if kind == LOOKED else None
        cause = "cpu_ranks" if kind and device == "cpu" else None
        found.append((check, subject, status, action, look, cause))
    return found


def _cleared(scenario: str) -> list[Row]:
    found: list[Row] = [(c, s, OK, None, U, None) if kind else (c, s, status, None, None, None)
                        for c, s, status, kind in EXPECTED[scenario]]
    return [(P, None, OK, None, None, None), *found] if scenario == "pairwise" else found


@pytest.mark.parametrize(("scenario", "second", "device"), CASES)
def test_each_comm_verdict_keeps_its_check_status_and_action_with_its_look_as_data(
        scenario: str, second: str, device: str) -> None:
    assert rows(scenario, second, device) == expected(scenario, second, device)


def test_rank_zero_plans_each_slow_node_beside_the_known_good_node_nearest_the_median(
        ) -> None:
    nodes, healthy = _nodes("cuda", None), _healthy("cuda", None)
    assert plan(node_figures(nodes["ranks"], read_comm(nodes).pairs, []), 0.9) == {
        "kind": "pairs", "suspects": [2], "known_good": 0}
    assert plan(node_figures(healthy["ranks"], read_comm(healthy).pairs, []), 0.9) is None
    by_time = _nodes_by_time("cuda", None)
    rows = by_time["collectives"]["all_reduce"]
    assert plan(node_figures(by_time["ranks"], [], rows), 0.9) == {
        "kind": "all_reduce", "suspects": [2], "known_good": 1}


def test_a_slow_node_is_judged_against_the_known_good_node_measured_beside_it() -> None:
    (pairs,) = [f for f in judged("nodes", "confirmed", "cuda") if f.check == NS]
    look = pairs.look
    assert look is not None and (look.first, look.again, look.reference, look.unit) == (
        2.0, 2.1, 9.9, "GB/s")
    assert [a.position() for a in look.against] == ["node0"]
    (times,) = judged("nodes_by_time", "confirmed", "cuda")[:1]
    # Times: lower is better, worse above the known-good node's time / 0.9.
    assert times.look is not None and (times.look.unit, times.look.bound.better,
                                       times.look.again, times.look.reference) == (
        "us", Better.LOWER, 390.0, 99.0)


def test_no_comm_module_words_a_look_or_names_an_action() -> None:
    """The look is data and the action follows from it: no comm source writes the look's
    words into a message (render/words.py does) or passes an explicit action."""
    import ast
    from pathlib import Path

    import gpucheck.comm

    for path in sorted(Path(gpucheck.comm.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        texts = [n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not [t for t in texts if "confirmed:" in t or "unstable:" in t], path
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.keyword)
                    and n.arg == "action"], path


def test_a_cut_of_zero_condemns_nothing() -> None:
    """node_links.spread_cut falls to 0 when the healthy links' own spread is total: no
    measured rate is below 0 x the reference, and the bound still exists (a Bound needs
    a positive limit: the smallest float, which only a rate of exactly 0 is below)."""
    from gpucheck.comm.verdicts import rate_bound

    assert not rate_bound(0.0).worse(1e-12, 10.0)
    assert rate_bound(0.5).worse(4.9, 10.0) and not rate_bound(0.5).worse(5.0, 10.0)


def test_gloo_on_cuda_skips_send_recv_and_says_why() -> None:
    """gloo sends host tensors only: on CUDA buffers the pair's connection dropped (H100,
    torch 2.11). The pairs and node-to-node rounds are a SKIP naming nccl."""
    spec = CommSpec(backend="gloo", device="cuda", timeout_s=60)
    reason = p2p_unsupported(spec)
    assert reason is not None and "--backend nccl" in reason
    assert p2p_unsupported(CommSpec(backend="gloo", device="cpu", timeout_s=60)) is None
    assert p2p_unsupported(CommSpec(backend="nccl", device="cuda", timeout_s=60)) is None
    result = _result("cuda", _ranks(4, 2, "cuda"), p2p_skipped=reason)
    sections = {s.name: s for s in comm_sections(result, Verdicts(0.5, None, 0.9))}
    for name, check in (("pairwise", "comm.pairwise.slow_pair"),
                        ("internode", "comm.internode.slow_pair")):
        [finding] = sections[name].findings
        assert (finding.check, finding.status, finding.message) == (check, SKIP, reason)


def test_a_run_that_can_send_has_no_skipped_pairwise_section() -> None:
    result = _result("cpu", _ranks(2, 2, "cpu"), p2p_skipped=None)
    assert "pairwise" not in {s.name for s in comm_sections(result, Verdicts(0.5, None, 0.9))}
