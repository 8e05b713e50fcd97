"""Stress: a figure below its bound is measured again before it becomes a WARN.

Pure functions (gpucheck.stress.verdicts) on handmade figures; the real CPU runs with
a rank slow in both measurements and one slow in the first only are in
test_stress_runs.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed

from gpucheck.context import RunContext
from gpucheck.measure import Better, LookState
from gpucheck.report import Status
from gpucheck.stress import copies, gemm, verdicts
from gpucheck.stress.records import CopyRow
from gpucheck.stress.verdicts import (
    again_of,
    expected_findings,
    peer_findings,
    suspect_ranks,
)

H200 = "NVIDIA H200"


def _ranks(count: int, gpu: str | None = H200) -> list[dict[str, Any]]:
    return [{"rank": r, "node_rank": 0, "host": "n0", "local_rank": r, "device": f"cuda:{r}",
             "gpu": f"GPU {r} ({gpu})", "gpu_name": gpu} for r in range(count)]


def _bf16(model: str | None) -> gemm.Figure | None:
    return gemm.gemm_figure(model, "bf16")


GEMM = ("stress.gemm.peers", "stress.gemm.expected")
FIRST = {0: 780.0, 1: 790.0, 2: 785.0, 3: 400.0}  # rank 3 at half its peers and the model


def test_a_rank_below_its_peers_or_its_model_is_a_suspect_to_measure_again() -> None:
    assert suspect_ranks(GEMM, FIRST, _ranks(4), 0.9, _bf16, 0.8) == [3]
    healthy = {0: 780.0, 1: 790.0, 2: 785.0, 3: 775.0}
    assert suspect_ranks(GEMM, healthy, _ranks(4), 0.9, _bf16, 0.8) == []
    # Every H200 slow alike: no peer is worse, but every one is below the model's figure.
    assert suspect_ranks(GEMM, {r: 500.0 for r in range(4)}, _ranks(4), 0.9, _bf16, 0.8) == [
        0, 1, 2, 3]


def _peers(again: dict[int, float] | None) -> list[Any]:
    rows = [{"rank": r, "dtype": "bf16", "tflops_p50": v} for r, v in (again or {}).items()]
    return peer_findings("stress.gemm.peers", "bf16 GEMM", "TFLOP/s", FIRST, _ranks(4), 0.9,
                         again=again_of(rows or None, "tflops_p50", "bf16"))


def test_a_slow_rank_slow_again_is_confirmed_against_its_node_measured_with_it() -> None:
    (found,) = _peers({0: 781.0, 1: 789.0, 2: 786.0, 3: 402.0})
    assert (found.status, found.subject.label, found.action) == (Status.WARN, "rank 3",
                                                           "drain-node")
    look = found.look
    assert look is not None and look.state is LookState.CONFIRMED
    assert (look.first, look.again) == (400.0, 402.0)
    assert look.reference == pytest.approx(783.5)  # its node measured again with it
    assert [s.rank for s in look.against] == [0, 1, 2]
    assert (found.subject.rank, found.subject.node, found.subject.host) == (3, 0, "n0")


def test_a_slow_rank_fine_the_second_time_is_an_ok_keeping_its_unstable_look() -> None:
    summary, found = _peers({0: 781.0, 1: 789.0, 2: 786.0, 3: 779.0})
    assert (summary.subject, summary.status) == (None, Status.OK)
    assert (found.status, found.subject.label, found.action) == (Status.OK, "rank 3", None)
    assert found.look is not None and found.look.state is LookState.UNSTABLE
    assert "unstable" not in found.message  # the message says the first figure only


def test_a_slow_rank_not_measured_again_says_so() -> None:
    (found,) = _peers(None)
    assert (found.status, found.action) == (Status.WARN, "rerun")
    assert found.look is not None and found.look.state is LookState.NOT_MEASURED
    assert found.look.why_not == verdicts.NO_SECOND
    (absent,) = _peers({0: 781.0, 1: 789.0, 2: 786.0})  # the rank itself was not
    assert absent.look is not None and absent.look.why_not == verdicts.RANK_NOT_AGAIN
    assert absent.action == "rerun"


def test_healthy_peers_stay_ok_whatever_the_second_measurement() -> None:
    healthy = {0: 780.0, 1: 790.0, 2: 785.0, 3: 775.0}
    found = peer_findings("stress.gemm.peers", "bf16 GEMM", "TFLOP/s", healthy, _ranks(4), 0.9,
                          again=again_of([{"rank": 3, "tflops_p50": 100.0}], "tflops_p50"))
    assert [f.status for f in found] == [Status.OK]


def _expected(again: float) -> list[Any]:
    first = {0: 500.0}
    return expected_findings("stress.gemm.expected", "bf16 GEMM", "TFLOP/s", first,
                             _ranks(1), _bf16, 0.8,
                             again_of([{"rank": 0, "tflops_p50": again}], "tflops_p50"))


def test_below_the_models_figure_twice_is_confirmed_and_once_is_unstable() -> None:
    (confirmed,) = _expected(510.0)
    assert (confirmed.status, confirmed.action) == (Status.WARN, "fix-config")
    assert confirmed.look is not None and confirmed.look.state is LookState.CONFIRMED
    figure = _bf16(H200)
    assert figure is not None
    assert (confirmed.look.again, confirmed.look.reference) == (510.0, figure.typical)
    assert confirmed.look.against == ()  # against the model's figure, not a peer
    (unstable,) = _expected(780.0)  # fine again: an OK keeping its look (issue 36)
    assert (unstable.status, unstable.action) == (Status.OK, None)
    assert unstable.look is not None and unstable.look.state is LookState.UNSTABLE
    (missing,) = expected_findings("stress.gemm.expected", "bf16 GEMM", "TFLOP/s", {0: 500.0},
                                   _ranks(1), _bf16, 0.8)
    assert missing.look is not None and missing.look.state is LookState.NOT_MEASURED
    assert missing.action == "fix-config"  # below the model's figure, not cleared


def _copy_row(rank: int, alone: float, together: float) -> dict[str, Any]:
    return {"rank": rank, "size_bytes": 1 << 28, "h2d_alone_gbps": alone,
            "d2h_alone_gbps": alone + 1, "h2d_together_gbps": together,
            "d2h_together_gbps": together + 1,
            "link": "Gen5 x16", "link_gbps": 63.0}


def _copy_suspects(rows: list[dict[str, Any]]) -> list[int]:
    return verdicts.crossed(copies.copy_findings([CopyRow(**r) for r in rows], _ranks(3),
                                                 0.6, 0.9))


def test_host_copies_below_the_link_or_their_peers_are_measured_again() -> None:
    rows = [_copy_row(0, 55.0, 50.0), _copy_row(1, 20.0, 50.0), _copy_row(2, 55.0, 20.0)]
    assert _copy_suspects(rows) == [1, 2]
    healthy = [_copy_row(r, 55.0, 50.0) for r in range(3)]
    assert _copy_suspects(healthy) == []


def test_a_slow_link_is_confirmed_by_its_second_copies_alone_or_found_unstable() -> None:
    first = [{"rank": 0, "h2d_gbps": 20.0, "d2h_gbps": 21.0, "link": "Gen5 x16",
              "link_gbps": 63.0}]
    for value, state, status, action in (
            (21.0, LookState.CONFIRMED, Status.WARN, "drain-node"),
            (55.0, LookState.UNSTABLE, Status.OK, None)):
        again = verdicts.copies_again([_copy_row(0, value, 50.0)], "alone")
        found, *_ = verdicts.link_findings("stress.copies.link", first, _ranks(1), 0.6, again)
        assert (found.status, found.action) == (status, action)
        assert found.look is not None and found.look.state is state
        assert (found.look.first, found.look.again, found.look.reference) == (20.0, value, 63.0)
    (missing,) = verdicts.link_findings("stress.copies.link", first, _ranks(1), 0.6)
    assert missing.look is not None and missing.look.state is LookState.NOT_MEASURED
    assert missing.action == "rerun"


def test_the_worker_copies_again_only_when_a_rank_is_a_suspect(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies step's wiring without a GPU: its measurement and collectives faked."""
    from gpucheck.stress import copies as copy_phases
    from gpucheck.stress.rank import StressSpec

    spec = StressSpec(device="cuda", backend="nccl", timeout_s=1.0, dtypes=("bf16",),
                      size=16, duration_s=1.0, warmup_s=0.0, gemm_window_s=0.0,
                      membw_window_s=0.0)
    world = SimpleNamespace(rank=0, is_reporter=True)
    ctx = SimpleNamespace(spec=spec, world=world, run=RunContext())
    for first, measured_again in ((20.0, True), (55.0, False)):
        copies = iter([_copy_row(0, first, 50.0), _copy_row(0, 55.0, 50.0)])
        monkeypatch.setattr(copy_phases, "copy_row", lambda ctx, result, it=copies: next(it))
        monkeypatch.setattr(copy_phases, "gather", lambda ctx, mine: [mine])
        monkeypatch.setattr(torch.distributed, "broadcast_object_list",
                            lambda box, src, group=None: None)
        monkeypatch.setattr(copy_phases, "publish", lambda ctx, result: None)
        result: dict[str, Any] = {"ranks": _ranks(1)}
        copy_phases.copies_phase(ctx, result)  # type: ignore[arg-type]
        assert ("again" in result["copies"]) is measured_again


# --- the peer-copy matrix (stress.p2p) ------------------------------------------------


def _matrix(slow: dict[tuple[int, int], float] | None = None) -> list[dict[str, Any]]:
    cells = {(s, d): 380.0 + s + d for s in range(3) for d in range(3) if s != d}
    return [{"src": s, "dst": d, "peer_access": True, "gbps": v}
            for (s, d), v in (cells | (slow or {})).items()]


def test_a_healthy_matrix_is_not_measured_again_and_stays_ok() -> None:
    from gpucheck.stress.copies import second_look
    from gpucheck.stress.verdicts import p2p_findings

    asked: list[Any] = []
    assert second_look(_matrix(), 0.6, lambda wanted: asked.append(wanted) or []) == []
    assert asked == []
    found = p2p_findings({"pairs": _matrix()}, "node 0", 0.6)
    assert [f.status for f in found] == [Status.OK]


def test_a_slow_peer_pair_is_measured_again_beside_a_known_good_pair() -> None:
    from gpucheck.stress.copies import second_look

    asked: list[list[tuple[int, int]]] = []

    def measure(wanted: list[tuple[int, int]]) -> list[dict[str, Any]]:
        asked.append(wanted)
        return [{"src": s, "dst": d, "peer_access": True, "gbps": 1.0} for s, d in wanted]

    second_look(_matrix({(2, 0): 90.0}), 0.6, measure)
    (wanted,) = asked
    assert wanted[-1] == (2, 0) and len(wanted) >= 2
    assert all(2 not in pair or pair == (2, 0) for pair in wanted[:-1])  # known good


def _again(slow_again: float) -> list[dict[str, Any]]:
    return [{"src": 0, "dst": 1, "peer_access": True, "gbps": 381.0},
            {"src": 1, "dst": 0, "peer_access": True, "gbps": 381.0},
            {"src": 2, "dst": 0, "peer_access": True, "gbps": slow_again}]


def test_a_slow_peer_pair_slow_again_is_confirmed_and_fine_again_is_unstable() -> None:
    from gpucheck.stress.verdicts import p2p_findings

    first = _matrix({(2, 0): 90.0})
    (confirmed,) = p2p_findings({"pairs": first, "again": _again(88.0)}, "node 0", 0.6)
    assert (confirmed.status, confirmed.subject.label, confirmed.action) == (
        Status.WARN, "node 0 cuda:2->cuda:0", "drain-node")
    assert confirmed.subject.position() == "cuda2_to_cuda0"
    look = confirmed.look
    assert look is not None and look.state is LookState.CONFIRMED
    assert (look.first, look.again, look.reference) == (90.0, 88.0, 381.0)
    assert [s.position() for s in look.against] == ["cuda0_to_cuda1", "cuda1_to_cuda0"]
    unstable, summary = p2p_findings({"pairs": first, "again": _again(379.0)}, "node 0", 0.6)
    assert (unstable.status, unstable.action, summary.status) == (Status.OK, None, Status.OK)
    assert unstable.look is not None and unstable.look.state is LookState.UNSTABLE
    (older,) = p2p_findings({"pairs": first}, "node 0", 0.6)
    assert older.look is not None and older.look.state is LookState.NOT_MEASURED
    assert older.action == "rerun"


# --- the burn-in's straggler (stress.sdc.straggler: a time, lower is better) ----------

STRAGGLER = ("stress.sdc.straggler", None)
TIMES = {0: 7.0, 1: 7.2, 2: 30.0}  # ms per product: rank 2 four times slower


def test_a_slow_burn_in_rank_is_a_suspect_by_its_time_and_a_fast_one_is_not() -> None:
    assert suspect_ranks(STRAGGLER, TIMES, _ranks(3), 0.9, lambda _: None, 0.8,
                         higher_is_better=False) == [2]
    assert suspect_ranks(STRAGGLER, {0: 7.0, 1: 7.2, 2: 7.1}, _ranks(3), 0.9,
                         lambda _: None, 0.8, higher_is_better=False) == []


def _straggler(again: dict[int, float] | None) -> list[Any]:
    rows = [{"rank": r, "p50_ms": v} for r, v in (again or {}).items()]
    return peer_findings("stress.sdc.straggler", "median burn-in product time", "ms", TIMES,
                         _ranks(3), 0.9, higher_is_better=False,
                         again=again_of(rows or None, "p50_ms"))


def test_a_burn_in_straggler_slow_again_is_confirmed_and_fine_again_is_unstable() -> None:
    (confirmed,) = _straggler({0: 7.1, 1: 7.0, 2: 29.0})
    assert (confirmed.subject.label, confirmed.action) == ("rank 2", "drain-node")
    assert confirmed.look is not None and confirmed.look.state is LookState.CONFIRMED
    assert (confirmed.look.again, confirmed.look.reference) == (29.0, 7.1)
    assert confirmed.look.bound.better is Better.LOWER
    _, unstable = _straggler({0: 7.1, 1: 7.0, 2: 7.3})
    assert (unstable.subject.label, unstable.status, unstable.action) == ("rank 2", Status.OK, None)
    assert unstable.look is not None and unstable.look.state is LookState.UNSTABLE
    (older,) = _straggler(None)
    assert older.look is not None and older.look.state is LookState.NOT_MEASURED
    assert older.action == "rerun"
    healthy = peer_findings("stress.sdc.straggler", "t", "ms", {0: 7.0, 1: 7.2, 2: 7.1},
                            _ranks(3), 0.9, higher_is_better=False)
    assert [f.status for f in healthy] == [Status.OK]
