"""gpucheck's own jobs arm the Flight Recorder; a failed gloo collective leaves a dump
that `gpucheck hang --traces` reads."""

from __future__ import annotations

import datetime
import os
import signal
from pathlib import Path

import pytest

from gpucheck.distributed import flight
from gpucheck.hang.trace_findings import traces_section
from gpucheck.hang.traces import dump_files, groups, load


def test_arming_sets_the_variables_and_restores_them_afterwards(monkeypatch) -> None:
    for name in (*flight.ARMED_VARS, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                 "TORCH_NCCL_TRACE_BUFFER_SIZE", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29555")
    with flight.armed("comm") as prefix:
        assert prefix == os.path.join(flight.dump_folder(), "comm_29555_rank_")
        assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == prefix
        assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == flight.BUFFER_ENTRIES
    assert not any(name in os.environ for name in flight.ARMED_VARS)


def test_a_users_own_dump_location_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/shared/fr/job_")
    with flight.armed("bench") as prefix:
        assert prefix is None and os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/fr/job_"


def test_a_gloo_rank_dumps_its_trace_after_a_failure(monkeypatch, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "rank_"))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        # A size no other test uses: the recorder's buffer is per process, and earlier
        # tests in this process left their own collectives in it.
        dist.all_reduce(torch.ones(4, 7))
        flight.dump_after_failure(0, "gloo")
    finally:
        dist.destroy_process_group()
    dumps, _ = load(dump_files(str(tmp_path)))
    calls = [c for group in groups(dumps) for c in group.calls.get(0, {}).values()]
    assert any(c.op == "all_reduce" and "7" in c.sizes for c in calls)


def test_gpucheck_comm_with_a_stopped_rank_leaves_dumps_that_name_it(tmp_path: Path) -> None:
    """End to end: gpucheck's own comm arms the recorder; rank 1 stops; the survivors
    dump after their collective times out; `gpucheck hang --traces` names rank 1."""
    from tests.comm_workers import clean_env, gpucheck, start, tracked, wait_for_file, wait_gone

    run, fr = tmp_path / "run", tmp_path / "fr"
    run.mkdir()
    fr.mkdir()
    args = gpucheck("comm", "--n-gpus", "3", "--timeout", "3", "--max-bytes", "64K",
                    "--iters", "3000", "--warmup", "1", "--no-pairwise", "-q",
                    "-o", str(tmp_path / "out.json"))
    proc = start(args, clean_env(GPUCHECK_RUN_DIR=str(run),
                                 TORCH_FR_DUMP_TEMP_FILE=str(fr / "comm_rank_")))
    with tracked([proc]) as seen:
        roster = wait_for_file(run / "roster.json", 90, proc)
        assert roster is not None, proc.communicate()
        seen.extend(r["pid"] for r in roster)
        assert wait_for_file(run / "partial.json", 60, proc) is not None
        os.kill(roster[1]["pid"], signal.SIGSTOP)
        proc.communicate(timeout=60)
        assert wait_gone(list(seen), within_s=5) == []
    section = traces_section(str(fr), None)
    assert section.data["ranks_dumped"] == [0, 2]
    assert [(f.check, f.subject) for f in section.findings] == [("hang.traces.no_dump", "rank 1")]
