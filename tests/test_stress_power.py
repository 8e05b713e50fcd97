"""Power reach under stress's GEMM (DCGM's targeted power): a GPU that cannot reach most
of its limit while its peers do, or whose limit is set below its default, is named;
healthy stays OK; CPU ranks and unreadable power are a SKIP. NVML is the fake."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from gpucheck.probes.nvml import Nvml
from gpucheck.records import as_dict
from gpucheck.report import Status
from gpucheck.stress import gemm as power
from gpucheck.stress.records import PowerReading
from gpucheck.stress.report import Verdicts, stress_sections
from tests.fake_pynvml import FakeGpu, FakeNvml

NAMES = {r: f"rank {r}" for r in range(4)}


def _sample(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu) -> PowerReading:
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    nvml = Nvml(2.0)
    with power.PowerSampler(0, gpu.bus_id, nvml, every_s=0.01) as sampler:
        deadline = time.monotonic() + 30
        while len(sampler.samples_w) < 5 and sampler.why is None and \
                time.monotonic() < deadline:
            time.sleep(0.01)
    nvml.shutdown()
    return sampler.result()


def test_the_sampler_reads_draw_limit_and_default_limit(monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    row = _sample(monkeypatch, FakeGpu(power_mw=690_000, power_limit_mw=700_000,
                                       power_default_limit_mw=700_000))
    assert row.samples >= 5 and row.why is None
    assert (row.draw_p90_w, row.limit_w, row.default_limit_w) == (690.0, 700.0, 700.0)


def test_a_gpu_without_power_readings_is_a_skip_with_why(monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    row = _sample(monkeypatch, FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"}))
    assert row.samples == 0 and row.why is not None and "nvmlDeviceGetPowerUsage" in row.why
    (found,) = power.power_findings([row], [_rank(0)], NAMES)
    assert (found.check, found.status) == ("stress.power.reach", Status.SKIP)


def test_cpu_ranks_skip_power() -> None:
    with power.PowerSampler(0, None) as sampler:
        pass
    (found,) = power.power_findings([sampler.result()], [_rank(0)], NAMES)
    assert found.status is Status.SKIP and power.CPU_REASON in found.message


def _rank(rank: int, node: int = 0) -> dict[str, Any]:
    return {"rank": rank, "node_rank": node, "host": f"n{node}", "local_rank": rank,
            "device": f"cuda:{rank}", "gpu": f"GPU {rank}", "gpu_name": "NVIDIA H100"}


def _row(rank: int, draw: float, limit: float = 700.0, default: float = 700.0,
         ) -> PowerReading:
    return PowerReading(rank=rank, samples=50, draw_p90_w=draw, draw_max_w=draw + 5,
                        limit_w=limit, default_limit_w=default, why=None)


RANKS = [_rank(r) for r in range(4)]


def _statuses(rows: list[PowerReading]) -> list[tuple[str, Status, str | None, str | None]]:
    return [(f.check, f.status, f.subject and f.subject.label, f.action)
            for f in power.power_findings(rows, RANKS, NAMES)]


def test_healthy_gpus_at_their_limit_stay_ok() -> None:
    rows = [_row(r, d) for r, d in enumerate((690.0, 695.0, 682.0, 688.0))]
    assert [(c, s) for c, s, _, _ in _statuses(rows)] == [
        ("stress.power.reach", Status.OK), ("stress.power.limit", Status.OK)]


def test_a_gpu_short_of_its_limit_while_its_peers_reach_theirs_is_named() -> None:
    rows = [_row(r, d) for r, d in enumerate((690.0, 695.0, 682.0, 400.0))]
    assert _statuses(rows)[0] == ("stress.power.reach", Status.WARN, "rank 3", "rerun")


def test_a_load_that_brings_no_gpu_to_its_limit_names_none() -> None:
    rows = [_row(r, d) for r, d in enumerate((300.0, 310.0, 295.0, 200.0))]
    assert {s for _, s, _, _ in _statuses(rows)} == {Status.OK}


def test_a_limit_below_the_default_is_named_as_a_setting() -> None:
    rows = [_row(r, 690.0) for r in range(3)] + [_row(3, 495.0, limit=500.0)]
    found = _statuses(rows)
    assert ("stress.power.limit", Status.WARN, "rank 3", "fix-config") in found
    assert not [f for f in found if f[0] == "stress.power.reach" and f[1] is Status.WARN]


def test_the_gemm_section_carries_the_power_verdicts() -> None:
    rows = [_row(r, d) for r, d in enumerate((690.0, 695.0, 682.0, 400.0))]
    ranks = [r | {"gpu_name": "NVIDIA H200"} for r in RANKS]
    gemm = [{"rank": r, "dtype": "bf16", "size": 8192, "iters": 900, "tflops": 700.0,
             "tflops_p50": 700.0, "p50_ms": 1.5, "p99_ms": 1.6} for r in range(4)]
    result = {"world_size": 4, "device": "cuda", "backend": "nccl", "dtypes": ["bf16"],
              "size": 8192, "duration_s": 30.0, "ranks": ranks, "gemm": gemm,
              "power": [as_dict(r) for r in rows],
              "membw": None, "sdc": None, "copies": None, "p2p": None,
              "phases_planned": ["gemm"], "phases_done": ["gemm"]}
    section = next(s for s in stress_sections(result, Verdicts(0.9, 0.8, 0.6))
                   if s.name == "gemm")
    warned = [(f.check, f.subject and f.subject.label) for f in section.findings
              if f.status is Status.WARN]
    assert ("stress.power.reach", "rank 3") in warned
    assert section.data["power under load (W)"][3]["reach"] == round(400 / 700, 3)
