"""Ctrl-C keeps what was measured: a bench stopped in its timed loop keeps every
rank's timed iterations so far, and their summary, in the partial report.

The real run is stopped once every rank has published timed iterations (each rank's
own file in the run directory, `gpucheck.bench.findings`); the pure tests check the
section built from published figures.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from comm_workers import PYTHON, clean_env, gpucheck, start, tracked, wait_gone
from test_signals import END_S, LONG_BENCH, START_S, interrupted, one_line

from gpucheck.bench import records
from gpucheck.bench.records import TimedSoFar, rank_row, timed_so_far_section
from gpucheck.context import RunContext, RunOptions
from gpucheck.distributed import progress


def wait_for_iterations(run: Path, ranks: int, proc: Any) -> dict[int, dict[str, Any]]:
    """Every rank's published figures once each has at least one timed iteration."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = progress.read_ranks(run)
        if len(found) == ranks and all(d["iters_done"] > 0 for d in found.values()):
            return found
        time.sleep(0.1)
    raise AssertionError(f"no timed iterations on every rank: {proc.communicate()}")


def test_ctrl_c_in_the_timed_loop_keeps_every_ranks_timed_iterations_and_summary(
        tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out.json"
    run.mkdir()
    proc = start(gpucheck(*LONG_BENCH, "--n-gpus", "2", "-q", "-o", str(out)),
                 clean_env(GPUCHECK_RUN_DIR=str(run)))
    with tracked([proc]) as seen:
        seen_before = wait_for_iterations(run, 2, proc)
        seen.extend(r["pid"] for r in json.loads((run / "roster.json").read_text()))
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        _, err = proc.communicate(timeout=END_S)
        assert wait_gone(seen) == [], "a worker outlived the command"
    assert proc.returncode == 130
    line = one_line(err, "bench")
    assert "interrupted (Ctrl-C)" in line and "partial report in" in line
    report = json.loads(out.read_text())
    assert interrupted(report)
    timed = next(s for s in report["sections"] if s["name"] == "timed_so_far")
    rows = {r["rank"]: r for r in timed["data"]["ranks"]}
    assert sorted(rows) == [0, 1]
    for rank, before in seen_before.items():
        assert rows[rank]["iters_done"] >= before["iters_done"] > 0
        assert rows[rank]["iters_planned"] == 5000 and rows[rank]["p50_ms"] > 0
    summary = timed["data"]["summary"]
    assert summary["ranks_with_iterations"] == "2 of 2"
    assert summary["total_images"] == sum(r["images"] for r in rows.values())


def test_a_rank_failing_in_the_timed_loop_keeps_every_ranks_iterations_so_far(
        tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    hooked = [PYTHON, str(Path(__file__).resolve().parent / "hooked.py"),
              "--model", "bench_workers:fail_rank_one_in_the_timed_loop", "gpucheck"]
    proc = start([*hooked, *LONG_BENCH, "--n-gpus", "2", "-q", "-o", str(out)], clean_env())
    with tracked([proc]):
        _, err = proc.communicate(timeout=START_S + END_S)
    assert proc.returncode == 1, err
    report = json.loads(out.read_text())
    failed = next(s for s in report["sections"] if s["name"] == "failure")
    assert [f["subject_fields"]["rank"] for f in failed["findings"]] == [1]
    timed = next(s for s in report["sections"] if s["name"] == "timed_so_far")
    rows = {r["rank"]: r for r in timed["data"]["ranks"]}
    assert sorted(rows) == [0, 1] and all(r["iters_done"] > 0 for r in rows.values())


def _published(rank: int, iter_ms: list[float], world_size: int = 2) -> dict[str, Any]:
    return {"rank": rank, "host": "node-a", "device": "cpu", "batch_size": 4,
            "iters_planned": 12, "world_size": world_size, "iters_done": len(iter_ms),
            "iter_ms": iter_ms}


def test_a_ranks_row_summarises_its_published_iterations() -> None:
    row = rank_row(_published(1, [100.0, 300.0, 200.0]))
    assert row is not None
    assert (row["iters_done"], row["images"], row["p50_ms"], row["max_ms"]) == (3, 12, 200.0,
                                                                                300.0)
    assert row["images_per_s"] == 20.0  # 12 images in 0.6 s of iterations


def test_the_section_names_the_ranks_that_published_nothing() -> None:
    section = timed_so_far_section({0: _published(0, [10.0, 30.0], world_size=3),
                                    2: _published(2, [], world_size=3)})
    assert section is not None
    assert [r["rank"] for r in section.data["ranks"]] == [0]
    assert section.data["ranks_without_iterations"] == [1, 2]
    assert section.data["summary"]["ranks_with_iterations"] == "1 of 3"
    assert not section.findings, "a stopped loop is shown, not judged"


def test_no_section_before_any_timed_iteration() -> None:
    assert timed_so_far_section({}) is None
    assert timed_so_far_section({0: _published(0, [])}) is None


def test_the_launcher_clears_rank_files_of_an_earlier_run_in_a_kept_folder(
        tmp_path: Path) -> None:
    from gpucheck.distributed import job

    (tmp_path / "rank-3.json").write_text(json.dumps(_published(3, [1.0])))
    kept = RunContext(RunOptions(run_dir=str(tmp_path)))  # GPUCHECK_RUN_DIR, as cli reads it
    with job._run_dir(kept) as folder:
        assert folder == tmp_path
        assert progress.read_ranks(folder) == {}
    assert tmp_path.is_dir()  # the user's folder is kept


class _Marks:
    """Ten finished iterations of 10 ms each."""

    def completed(self) -> int:
        return 11

    def read_ms(self, points: int | None = None) -> tuple[tuple[float, ...], tuple[()]]:
        return (10.0,) * 10, ()


def test_a_slow_write_spaces_the_next_ones_so_publishing_stays_under_1_percent(
        monkeypatch: Any, tmp_path: Path) -> None:
    clock = [100.0]
    monkeypatch.setattr(records.time, "perf_counter", lambda: clock[0])

    def slow_write(ctx: RunContext, rank: int, data: dict[str, Any]) -> None:
        clock[0] += 0.05  # a 50 ms write
        written.append(data["iters_done"])

    written: list[int] = []
    monkeypatch.setattr(records.progress, "publish_rank", slow_write)
    so_far = TimedSoFar(_Marks(), {"rank": 0}, RunContext())
    clock[0] += 1.0
    so_far.tick()  # 1 s since the start: publish
    clock[0] += 4.0
    so_far.tick()  # 4 s after a 50 ms write: under 100 x 50 ms, so not yet
    clock[0] += 1.0
    so_far.tick()
    assert written == [10, 10]
