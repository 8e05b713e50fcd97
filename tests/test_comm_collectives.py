"""The five collectives the field sweeps (issue 22, item 9): nccl-tests' algbw and busbw,
each checked element by element, on torch's current op names (no deprecation warning).

nccl-tests doc/PERFORMANCE.md ("Summary") gives the bus bandwidth factors: all_reduce
2(n-1)/n; reduce_scatter, all_gather and all_to_all (n-1)/n; broadcast 1. The data
size S in algbw = S / time is each test's `GetBw` (src/*.cu): the whole array for
all_gather (the gathered output) and reduce_scatter (the reduced input), the buffer
for the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comm_workers import PYTHON, clean_env, start, tracked, wait_gone

from gpucheck.cli import main
from gpucheck.comm.collectives import element_count
from gpucheck.comm.verdicts import COLLECTIVES, bus_factor, data_bytes, size_result

HOOKED = str(Path(__file__).resolve().parent / "hooked.py")

NCCL_TESTS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n,
                      "all_gather": lambda n: (n - 1) / n,
                      "reduce_scatter": lambda n: (n - 1) / n,
                      "all_to_all": lambda n: (n - 1) / n,
                      "broadcast": lambda n: 1.0}


@pytest.mark.parametrize("collective", sorted(NCCL_TESTS_FACTORS))
@pytest.mark.parametrize("world", [2, 3, 8])
def test_bus_factors_are_nccl_tests_for_every_collective(collective: str, world: int) -> None:
    assert bus_factor(collective, world) == pytest.approx(NCCL_TESTS_FACTORS[collective](world))
    assert bus_factor(collective, 1) is None  # one rank: nothing crosses a link


def test_the_data_size_is_the_whole_array_for_gather_and_reduce_scatter() -> None:
    # 1 MB per rank, 4 ranks: all_gather's output and reduce_scatter's input are 4 MB.
    assert data_bytes("all_gather", 250_000, 4) == 4_000_000
    assert data_bytes("reduce_scatter", 250_000, 4) == 4_000_000
    for collective in ("all_reduce", "all_to_all", "broadcast"):
        assert data_bytes(collective, 250_000, 4) == 1_000_000


def test_reduce_scatter_algbw_counts_the_reduced_input() -> None:
    result = size_result("reduce_scatter", 1_000_000, 250_000, 4, [0.002, 0.001, 0.001, 0.001],
                         [0, 0, 0, 0])
    assert result.algbw_gbps == pytest.approx(4e6 / 0.002 / 1e9)
    assert result.busbw_gbps == pytest.approx(result.algbw_gbps * 3 / 4, rel=1e-3)
    assert result.slowest_rank == 0


def test_broadcast_busbw_is_its_algbw() -> None:
    result = size_result("broadcast", 1_000_000, 250_000, 8, [0.001] * 8, [0] * 8)
    assert result.busbw_gbps == result.algbw_gbps == pytest.approx(1.0)


def test_all_to_all_splits_its_buffer_into_equal_chunks_one_per_rank() -> None:
    # 1 KiB is 256 float32: 3 ranks get 85 each (255 elements), as nccl-tests rounds
    # its count per peer down; algbw counts the 255 elements sent.
    assert element_count("all_to_all", 1024, 3) == 255
    assert element_count("all_to_all", 1024, 4) == 256
    assert element_count("all_to_all", 4, 8) == 8  # at least one element per rank
    assert element_count("all_gather", 1024, 3) == 256
    result = size_result("all_to_all", 1024, 255, 3, [1e-6] * 3, [0] * 3)
    assert result.algbw_gbps == pytest.approx(1020 / 1e-6 / 1e9, rel=1e-3)


def test_an_unknown_collective_is_a_usage_error_naming_the_five(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["comm", "--collectives", "all_reduce,alltoall"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert all(name in err for name in COLLECTIVES)


def test_bad_sizes_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["comm", "--min-bytes", "64K", "--max-bytes", "1K"]) == 2
    assert "--max-bytes" in capsys.readouterr().err


def test_the_sweep_on_three_gloo_ranks_checks_every_collective_and_confirms_a_slow_pair(
        tmp_path: Path) -> None:
    """One run through the CLI. torch 2.14 deprecates all_gather_into_tensor and
    reduce_scatter_tensor (a FutureWarning on every call): comm calls all_gather_single
    and reduce_scatter_single, and no rank warns. Rank 1 sleeps before each send to
    rank 0 in every batch (tests/hooked.py), far beyond noise: that pair is found and
    confirmed when measured again. No loopback reaches the baseline: a FAIL, exit 1."""
    out = tmp_path / "comm.json"
    env = clean_env(PYTHONWARNINGS="always::FutureWarning,always::DeprecationWarning")
    proc = start([PYTHON, HOOKED, "--slow-pair", "1:0:0.05", "gpucheck", "comm", "--n-gpus",
                  "3", "--max-bytes", "8K", "--iters", "2", "--warmup", "1", "--pair-bytes",
                  "64K", "--timeout", "60", "--baseline-busbw", "100000", "-q", "-o", str(out)],
                 env)
    with tracked([proc]) as seen:
        _, err = proc.communicate(timeout=240)
        assert wait_gone(seen) == []
    assert proc.returncode == 1, err
    assert "Warning" not in err and "deprecated" not in err, err
    report = json.loads(out.read_text())
    sections = {s["name"]: s for s in report["sections"]}
    assert [r["rank"] for r in sections["comm"]["data"]["ranks"]] == [0, 1, 2]
    for collective, factor in NCCL_TESTS_FACTORS.items():
        rows = sections[collective]["data"]["results"]
        assert [r["size_bytes"] for r in rows] == [1024, 2048, 4096, 8192]
        for row in rows:
            assert row["wrong"] == 0 and 0 <= row["slowest_rank"] < 3
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor(3), rel=0.01,
                                                      abs=2e-4)
        (correct,) = [f for f in sections[collective]["findings"]
                      if f["check"] == f"comm.{collective}.correct"]
        assert correct["status"] == "OK"
    assert [r["count"] for r in sections["all_to_all"]["data"]["results"]] == [
        255, 510, 1023, 2046]
    failed = [f["check"] for s in report["sections"] for f in s["findings"]
              if f["status"] == "FAIL"]
    assert failed == ["comm.all_reduce.busbw_baseline"]
    matrix = sections["pairwise"]["data"]["bandwidth_gbps (src row -> dst column)"]
    assert len(matrix) == 3 and all(row[f"to {d}"] > 0 for row in matrix for d in range(3)
                                    if row["src"] != f"rank {d}")
    # Which other pair a loaded 2-core machine also slows twice is noise: that no healthy
    # pair is named is judged on handmade figures in test_comm_confirm.py.
    confirmed = [f["subject"] for f in sections["pairwise"]["findings"]
                 if f["status"] == "WARN" and f["look"]["state"] == "confirmed"]
    assert "rank 1 -> rank 0" in confirmed
