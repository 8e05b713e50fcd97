"""-o writes only regular files, keeps what was there, and a failed write loses nothing."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from gpucheck import output
from gpucheck.cli import main

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
SAME = [str(REPORTS / "bench.json"), str(REPORTS / "bench.json")]  # compare: exit 0


def test_output_to_a_character_device_is_written_as_a_stream_and_the_device_left_alone(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = os.stat("/dev/null")
    assert main(["compare", *SAME, "-q", "-o", "/dev/null"]) == 0
    assert capsys.readouterr().err == ""
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_output_to_a_fifo_is_refused_without_blocking(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["compare", *SAME, "-o", str(fifo)]) == 2
    assert "a FIFO" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("aim", ["/dev/null", "real.json"])
def test_a_final_symlink_is_refused_and_its_target_left_alone(
        tmp_path: Path, aim: str, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "out.json"
    link.symlink_to(aim if aim.startswith("/") else real)
    assert main(["compare", *SAME, "-o", str(link)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symlink" in err
    assert link.is_symlink() and real.read_text() == "old"


def test_an_existing_report_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    target.write_text("old")
    target.chmod(0o600)
    assert main(["compare", *SAME, "-q", "-o", str(target)]) == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_text().startswith("{")


def test_save_baseline_and_output_naming_one_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "same.json"
    assert main(["fleet", str(REPORTS / "bench.json"), "-q", "-o", str(target),
                 "--save-baseline", str(tmp_path / "." / "same.json")]) == 2
    assert "both name" in capsys.readouterr().err
    assert not target.exists()


def _disk_full(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_still_shows_the_report_on_stdout_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(output.os, "fsync", _disk_full)
    target = tmp_path / "r.json"
    assert main(["compare", *SAME, "-o", str(target)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("gpucheck compare on ")  # the whole report, as text
    assert err.count("\n") == 1
    assert "No space left on device" in err and "on stdout" in err
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no temp file left


def test_a_full_disk_with_quiet_says_nothing_was_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(output.os, "fsync", _disk_full)
    assert main(["compare", *SAME, "-q", "-o", str(tmp_path / "r.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "nothing was kept" in err


def test_a_healthy_write_still_prints_the_report_and_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "r.md"
    assert main(["compare", *SAME, "-o", str(target)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("gpucheck compare on ") and err == ""
    assert target.read_text().startswith("# gpucheck compare")


def test_a_full_disk_for_the_baseline_keeps_the_fleet_report_and_fails_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync, calls = os.fsync, []

    def first_write_fails(fd: int) -> None:  # the baseline is written first, in run()
        calls.append(fd)
        if len(calls) == 1:
            _disk_full(fd)
        real_fsync(fd)

    monkeypatch.setattr(output.os, "fsync", first_write_fails)
    out = tmp_path / "fleet.json"
    assert main(["fleet", str(REPORTS / "bench.json"), "-q", "-o", str(out),
                 "--save-baseline", str(tmp_path / "baseline.json")]) == 1
    findings = [f for s in json.loads(out.read_text())["sections"] for f in s["findings"]]
    saved = [f for f in findings if f["check"] == "fleet.save_baseline"]
    assert len(saved) == 1 and saved[0]["status"] == "FAIL"
    assert "No space left on device" in saved[0]["message"]
    assert not (tmp_path / "baseline.json").exists()
