"""The comm sweep on real gloo ranks over loopback, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.cli import main


def _sweep(tmp_path: Path, nproc: int, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = tmp_path / "comm.json"
    code = main(["comm", "--n-gpus", str(nproc), "--min-bytes", "1K", "--max-bytes", "64K",
                 "--iters", "3", "--warmup", "1", "--timeout", "30", "-q", "-o", str(out),
                 *extra])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("nproc", [2, 3])
def test_comm_sweep_reports_every_size_with_nccl_tests_bandwidths(
        tmp_path: Path, nproc: int) -> None:
    code, report = _sweep(tmp_path, nproc)
    assert code == 0, report
    sections = {s["name"]: s for s in report["sections"]}
    assert [r["rank"] for r in sections["comm"]["data"]["ranks"]] == list(range(nproc))
    for name, factor in (("all_reduce", 2 * (nproc - 1) / nproc),
                         ("all_gather", (nproc - 1) / nproc)):
        rows = sections[name]["data"]["results"]
        assert [r["size_bytes"] for r in rows] == [1024 * 2 ** k for k in range(7)]
        for row in rows:
            assert row["wrong"] == 0
            assert 0 <= row["slowest_rank"] < nproc
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor, rel=0.01,
                                                      abs=2e-4)
    matrix = sections["pairwise"]["data"]["bandwidth_gbps (src row -> dst column)"]
    assert len(matrix) == nproc
    assert all(row[f"to {d}"] > 0 for row in matrix for d in range(nproc)
               if row["src"] != f"rank {d}")


def test_baseline_busbw_above_what_loopback_gives_is_a_fail(tmp_path: Path) -> None:
    code, report = _sweep(tmp_path, 2, "--no-pairwise", "--collectives", "all_reduce",
                          "--baseline-busbw", "100000")
    assert code == 1
    failed = [f["check"] for s in report["sections"] for f in s["findings"]
              if f["status"] == "FAIL"]
    assert failed == ["comm.all_reduce.busbw_baseline"]


def test_bad_sizes_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["comm", "--min-bytes", "64K", "--max-bytes", "1K"]) == 2
    assert "--max-bytes" in capsys.readouterr().err
