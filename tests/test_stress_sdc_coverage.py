"""One GPU alone is checked against the fp64 CPU reference on a row of every tile band,
each element within its own bound: a deterministic wrong element outside the first
rows is caught and a healthy product is within every bound (a healthy run's OK, saying
what was checked: tests/test_stress_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import stress_workers
import torch
from plant import Plant, planted

from gpucheck import agreement
from gpucheck.cli import main
from gpucheck.commands import stress as stress_command
from gpucheck.stress import burn
from gpucheck.stress.gemm import seeded_pair

N = 2048
ROWS = [5, 300, 1500]


def _product_rows(dtype: str) -> torch.Tensor:
    """The rows as a healthy device computes them (the dtype's inputs, its output)."""
    from gpucheck.stress.gemm import torch_dtype

    a, b = seeded_pair(N, burn.SDC_SEED, "cpu", "fp32", on_cpu=True)
    kind = torch_dtype(dtype)
    return (a[ROWS].to(kind).float() @ b.to(kind).float()).to(kind).float()


def test_a_healthy_bf16_product_is_within_every_elements_bound() -> None:
    reference, bound = burn.reference_and_bounds(N, "bf16", ROWS)
    assert burn.bound_excess(_product_rows("bf16"), reference, bound) <= burn.BOUND_TOLERANCE


def test_a_flipped_small_element_is_caught_where_the_largest_value_scale_missed_it() -> None:
    reference, bound = burn.reference_and_bounds(N, "bf16", ROWS)
    got = _product_rows("bf16")
    # A small element (|x| between 1 and 2) in row 1500, far from rows 0-15, sign-flipped.
    row = got[2]
    col = int(torch.nonzero((row.abs() > 1) & (row.abs() < 2))[0])
    got[2, col] = -got[2, col]
    assert agreement.relative_deviation(got, reference) < burn.TOLERANCE["bf16"]  # the old scale
    assert burn.bound_excess(got, reference, bound) > burn.BOUND_TOLERANCE


def test_a_non_finite_element_is_beyond_any_bound() -> None:
    reference, bound = burn.reference_and_bounds(N, "fp32", ROWS)
    got = _product_rows("fp32")
    got[1, 9] = float("nan")
    assert burn.bound_excess(got, reference, bound) == float("inf")


def test_coverage_says_how_much_of_the_product_was_checked() -> None:
    assert burn.coverage(512, list(range(512))) == "all 512 rows (262144 elements)"
    rows = burn.rows_to_check(8192, [torch.zeros(8192, 2, dtype=torch.int64)], seed=1)
    assert len(rows) == 128 and burn.coverage(8192, rows).startswith("128 of 8192 rows (1.6%")


def test_every_output_tile_of_the_lowest_height_has_a_row_checked() -> None:
    """cuBLAS's lowest tiles are 64 rows high: each must hold a drawn row, whatever the
    draw (one row per 128-row band left half of them unchecked)."""
    for seed in range(20):
        rows = set(burn.rows_to_check(8192, [torch.zeros(8192, 2, dtype=torch.int64)], seed))
        assert all(rows & set(range(tile, tile + 64)) for tile in range(0, 8192, 64))


def test_one_rank_with_a_wrong_tile_outside_the_first_rows_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1088 > FULL_REFERENCE_MAX: one row of each 64-row band is checked (17 rows); short
    # GEMM and copy windows, the burn-in is what is judged.
    monkeypatch.setitem(stress_command.DEFAULTS, "cpu", stress_command.Defaults(
        size=1088, duration_s=0.1, warmup_s=0.05, gemm_window_s=0.3, membw_window_s=0.2))
    out = tmp_path / "stress.json"
    with planted(Plant(stress=stress_workers.wrong_tile_band_two)):
        main(["stress", "--n-gpus", "1", "--timeout", "60", "-q", "--dtypes", "fp32",
              "--format", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    found = [f for s in report["sections"] for f in s["findings"]
             if f["check"] == "stress.sdc.agreement"]
    assert [(f["status"], f["subject"]) for f in found] == [("FAIL", "rank 0")]
    data = next(s for s in report["sections"] if s["name"] == "sdc")["data"]
    assert data["rows_vs_reference"] == 17 and data["reference"] == "per-element bound"
    assert data["reference_coverage"].startswith("17 of 1088 rows")
