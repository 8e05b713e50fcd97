"""The stress peer verdicts on what real runs gathered (tests/data/stress/README.md).

A live run on shared CPU cores can slow a healthy rank or speed up a planted one in any
one measurement, so how many figures cross a bar is judged here, on recorded figures,
where it cannot change from run to run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucheck.commands.stress import (
    DEFAULT_COPY_FRACTION,
    DEFAULT_CPU_PEER_FRACTION,
    DEFAULT_EXPECTED_FRACTION,
)
from gpucheck.report import Status
from gpucheck.stress.report import Verdicts, stress_sections

DATA = Path(__file__).resolve().parent / "data" / "stress"
CPU = Verdicts(DEFAULT_CPU_PEER_FRACTION, DEFAULT_EXPECTED_FRACTION, DEFAULT_COPY_FRACTION)


def judged(name: str) -> list[tuple[str, str, str | None, str | None, str | None]]:
    """(status, check, subject, action, look) of every WARN and FAIL, and of every
    finding with a second look."""
    result: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return [(f.status.value, f.check, None if f.subject is None else str(f.subject),
             f.action, f.look.state.value if f.look else None)
            for s in stress_sections(result, CPU) for f in s.findings
            if f.status in (Status.WARN, Status.FAIL) or f.look is not None]


def test_a_rank_slow_only_in_its_first_measurements_is_three_oks_keeping_their_looks() -> None:
    found = judged("wrong-rank-1-slow-once")
    peers = [f for f in found if f[1] in ("stress.gemm.peers", "stress.membw.peers")]
    # fp32 and bf16 GEMM, then memory: each slow the first time, fine the second: "act
    # only if it repeats" asks nothing, an OK that keeps its look (issue 36 item 4).
    assert peers == [("OK", "stress.gemm.peers", "rank 1", None, "unstable")] * 2 + [
        ("OK", "stress.membw.peers", "rank 1", None, "unstable")]
    assert [f for f in found if f[0] == "FAIL"] == [
        ("FAIL", "stress.sdc.agreement", "rank 1", "drain-node", None)]


def test_a_rank_slow_in_every_measurement_is_confirmed_in_both_gemm_dtypes() -> None:
    found = judged("slow-rank-1-changing-rank-2")
    gemm = [f for f in found if f[1] == "stress.gemm.peers"]
    assert gemm == [("WARN", "stress.gemm.peers", "rank 1", "drain-node", "confirmed")] * 2
    assert ("WARN", "stress.sdc.straggler", "rank 1", "drain-node", "confirmed") in found
    assert [f[1:3] for f in found if f[0] == "FAIL"] == [("stress.sdc.repeat", "rank 2")]


@pytest.mark.parametrize("name", ["wrong-rank-1-slow-once", "slow-rank-1-changing-rank-2"])
def test_no_healthy_rank_is_named_slow(name: str) -> None:
    slow = {f[2] for f in judged(name) if f[1].endswith((".peers", ".straggler"))
            and f[0] != "OK"}
    assert slow <= {"rank 1"}  # rank 1 itself is named only where it is slow twice
