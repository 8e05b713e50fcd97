"""gpucheck's own jobs arm the Flight Recorder; a failed gloo collective leaves a dump
that `gpucheck hang --traces` reads."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.distributed import deadline
from gpucheck.distributed.job import flight_findings


def test_arming_sets_the_variables_and_restores_them_afterwards(monkeypatch) -> None:
    for name in (*deadline.ARMED_VARS, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                 "TORCH_NCCL_TRACE_BUFFER_SIZE", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29555")
    with deadline.armed("comm") as prefix:
        assert prefix == os.path.join(deadline.dump_folder(), "comm_29555_rank_")
        assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == prefix
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == deadline.BUFFER_ENTRIES
    assert not any(name in os.environ for name in deadline.ARMED_VARS)


def test_a_users_own_dump_location_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/shared/fr/job_")
    with deadline.armed("bench") as prefix:
        assert prefix is None and os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/fr/job_"


@pytest.fixture
def own_folder(monkeypatch, tmp_path: Path) -> Path:
    """The default dump folder moved under tmp_path (the test may make it hostile)."""
    folder = tmp_path / "gpucheck-fr-test"
    monkeypatch.setattr(deadline, "dump_folder", lambda: str(folder))
    for name in (*deadline.ARMED_VARS, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    return folder


def test_the_dump_folder_is_made_private_to_its_user(own_folder: Path) -> None:
    with deadline.armed("comm") as prefix:
        assert prefix is not None and prefix.startswith(str(own_folder))
    info = os.lstat(own_folder)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()


def test_a_folder_others_can_write_is_refused_and_the_run_goes_on_unarmed(
        own_folder: Path, capsys) -> None:
    own_folder.mkdir()
    own_folder.chmod(0o777)  # what another user makes to catch root's files
    with deadline.armed("comm") as prefix:
        assert prefix is None and "TORCH_FR_DUMP_TEMP_FILE" not in os.environ
    assert "may be written by other users" in capsys.readouterr().err
    assert stat.S_IMODE(os.lstat(own_folder).st_mode) == 0o777  # left as it was


def test_a_folder_of_another_user_is_refused(own_folder: Path, monkeypatch) -> None:
    own_folder.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.lstat(own_folder).st_uid + 4242)
    with pytest.raises(deadline.UnsafeFolder, match="belongs to uid"):
        deadline.private_folder(str(own_folder))
    assert deadline.arm("bench", {}) is None


def test_a_link_in_place_of_the_folder_is_refused_never_followed(
        own_folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    own_folder.symlink_to(target)
    with pytest.raises(deadline.UnsafeFolder, match="not a directory"):
        deadline.private_folder(str(own_folder))
    assert deadline.arm("bench", {}) is None and list(target.iterdir()) == []


def test_a_folder_of_this_user_closed_to_writers_is_taken_and_closed(own_folder: Path) -> None:
    own_folder.mkdir(mode=0o755)  # what an older gpucheck made
    own_folder.chmod(0o755)
    assert deadline.private_folder(str(own_folder)) == str(own_folder)
    assert stat.S_IMODE(os.lstat(own_folder).st_mode) == 0o700


def test_a_torch_without_the_dump_function_is_a_visible_skip(monkeypatch, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "rank_"))
    monkeypatch.delattr(torch._C._distributed_c10d, "_dump_fr_trace")
    outcome = deadline.dump_after_failure(3, "gloo")
    assert outcome is not None and outcome.path is None
    assert "_dump_fr_trace" in (outcome.skipped or "") and list(tmp_path.iterdir()) == []
    findings = flight_findings([{"rank": 3, "flight_recorder": outcome.as_dict()}], "comm")
    assert [(f.check, f.status.value, f.subject.label) for f in findings] == [
        ("comm.flight_recorder", "SKIP", "rank 3")]


def test_a_dump_that_does_not_return_is_given_up_not_waited_for(monkeypatch,
                                                                tmp_path: Path) -> None:
    import threading

    release = threading.Event()
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "rank_"))
    monkeypatch.setattr(deadline, "dumper", lambda backend: (lambda: release.wait(30) and b"",
                                                           None))
    try:
        outcome = deadline.dump_after_failure(0, "nccl", wait_s=0.2)
    finally:
        release.set()
    assert outcome is not None and "did not return" in (outcome.skipped or "")


def test_an_unarmed_job_dumps_nothing(monkeypatch) -> None:
    for name in deadline.PREFIX_VARS:
        monkeypatch.delenv(name, raising=False)
    assert deadline.dump_after_failure(0, "gloo") is None


def test_an_nccl_timeout_ends_the_rank_promptly_with_a_dump_of_the_stuck_op(
        tmp_path: Path) -> None:
    """Needs a GPU (issue 33): what torch can deliver under gpucheck's own path, run by
    benchmarks/nccl_timeout_probe.py (1 NCCL rank, an all_reduce behind a ~10 s GPU
    sleep, a 3 s timeout): gpucheck's deadline raises in the rank, its dump (taken
    before the abort) shows the stuck all_reduce not completed, and the rank exits
    within the timeout + 10 s. The claim it replaces (the watchdog makes the next
    collective raise) failed on an H100 with torch 2.11 (docs/hang.md)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: NCCL runs only with one")
    from tests.comm_workers import ROOT

    done = subprocess.run([sys.executable, "benchmarks/nccl_timeout_probe.py", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "probe.json").read_text())
    said = json.dumps(result, indent=1)[-6000:]
    assert result["rank"]["raised"] and result["rank"]["raised"]["comm_error"], said
    assert result["rank"]["raised"]["aborted"] and result["rank"]["exit_code"] == 1, said
    assert result["goals"] == {"exited_under_timeout_plus_10s": True,
                               "raised_in_the_rank": True, "gpucheck_dump_exists": True,
                               "stuck_op_not_completed": True}, said
