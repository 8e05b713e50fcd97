"""membw counts the copied bytes once, as nvbandwidth prints the same copy, and the
expected figures are in that unit (a copy moves each byte twice: read, then write)."""

from __future__ import annotations

from typing import Any

import pytest

from gpucheck.report import Status
from gpucheck.stress import gemm, verdicts

MIB = 1 << 20


def test_a_copy_counts_its_bytes_once_as_nvbandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    # nvbandwidth device_local_copy: copy size x loops / time (memcpy.cpp, doMemcpyCore).
    monkeypatch.setattr(gemm, "timed_window", lambda *a, **k: [0.002, 0.001, 0.001])
    record = gemm.measure_copy(0, 4 * MIB, "cpu", "cpu", 0.0, 0.0)
    assert record.gbps_p50 == pytest.approx(4 * MIB / 0.001 / 1e9)
    assert record.gbps == pytest.approx(3 * 4 * MIB / 0.004 / 1e9)


def test_the_h200_copy_figure_is_the_measured_fraction_of_half_the_datasheet() -> None:
    figure = gemm.copy_figure("NVIDIA H200")
    assert figure is not None and figure.measured
    # 4.3 TB/s read + write measured = 2.15 TB/s copied; 0.89 of 2400 GB/s.
    assert figure.typical == pytest.approx(2136.0)
    assert "2.15 TB/s" in figure.source and "half of the datasheet" in figure.source


def _h200(rank: int) -> dict[str, Any]:
    return {"rank": rank, "node_rank": 0, "host": "n0", "local_rank": rank,
            "device": f"cuda:{rank} NVIDIA H200", "gpu_name": "NVIDIA H200",
            "gpu": f"GPU {rank} (NVIDIA H200, bus 00000000:{rank + 16:02X}:00.0, GPU-{rank})"}


def test_a_healthy_h200_at_nvbandwidths_figure_stays_ok_and_a_slow_one_is_named() -> None:
    # 2150 GB/s is what nvbandwidth prints for a healthy H200's device_local_copy; before
    # the unit was fixed, the figure expected 4272 GB/s of it and this was a false WARN.
    ranks = [_h200(0), _h200(1)]
    healthy = verdicts.expected_findings("stress.membw.expected", "copy", "GB/s",
                                         {0: 2150.0, 1: 2120.0}, ranks, gemm.copy_figure, 0.8)
    assert [f.status for f in healthy] == [Status.OK]
    slow = verdicts.expected_findings("stress.membw.expected", "copy", "GB/s",
                                      {0: 2150.0, 1: 1200.0}, ranks, gemm.copy_figure, 0.8)
    warned = [f for f in slow if f.status is Status.WARN]
    assert len(warned) == 1 and "GPU 1" in str(warned[0].subject or "") + warned[0].message
