"""Root never writes through a link another user planted, nor where one could plant it.

The second user is simulated: folders chowned to uid 65534 (nobody) or opened to all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.cli import main

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
SAME = [str(REPORTS / "bench.json"), str(REPORTS / "bench.json")]  # compare: exit 0
ROOT = Path(__file__).resolve().parents[1]
OTHER_UID = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rules are root's")


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.conf"
    path.write_text("precious\n")
    return path


def _others_folder(tmp_path: Path, how: str) -> Path:
    folder = tmp_path / how
    folder.mkdir()
    if how == "owned":
        os.chown(folder, OTHER_UID, OTHER_UID)
    else:
        folder.chmod(0o777 if how == "open" else 0o1777)
    return folder


@pytest.mark.parametrize("how", ["owned", "open"])
def test_output_in_a_folder_another_user_can_write_is_refused_before_the_run(
        tmp_path: Path, victim: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _others_folder(tmp_path, how)
    (folder / "hang.md").symlink_to(victim)
    for name in ("hang.md", "fresh.md"):  # a link, and a name a link could take later
        assert main(["compare", *SAME, "-o", str(folder / name)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "another user" in err
    assert victim.read_text() == "precious\n" and not (folder / "fresh.md").exists()


def test_the_exclude_file_is_not_truncated_through_a_planted_link(
        tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _others_folder(tmp_path, "open")
    (folder / "exclude.txt").symlink_to(victim)
    assert main(["preflight", "--exclude-file", str(folder / "exclude.txt")]) == 2
    assert "another user" in capsys.readouterr().err
    assert victim.read_text() == "precious\n"


def test_a_sticky_folder_takes_a_new_file_but_never_a_planted_link(
        tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _others_folder(tmp_path, "sticky")
    assert main(["compare", *SAME, "-q", "-o", str(folder / "gpucheck.prom")]) == 0
    assert (folder / "gpucheck.prom").read_text().startswith("# HELP")
    (folder / "link.prom").symlink_to(victim)
    assert main(["compare", *SAME, "-q", "-o", str(folder / "link.prom")]) == 2
    assert "symlink" in capsys.readouterr().err and victim.read_text() == "precious\n"


def test_a_folder_above_that_another_user_can_write_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inner = _others_folder(tmp_path, "open") / "reports"
    inner.mkdir(mode=0o755)  # root's own, but the folder above can swap it for a link
    assert main(["compare", *SAME, "-q", "-o", str(inner / "r.json")]) == 2
    assert "open may be written by other users" in capsys.readouterr().err


def test_output_to_stdout_appended_to_a_log_keeps_the_log(tmp_path: Path) -> None:
    log = tmp_path / "cron.log"
    log.write_text("yesterday's lines\n")
    with log.open("a") as handle:  # `gpucheck ... -o /dev/stdout >> cron.log`
        proc = subprocess.run([sys.executable, "-m", "gpucheck", "compare", *SAME, "-q",
                               "--format", "json", "-o", "/dev/stdout"], cwd=ROOT,
                              stdout=handle, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert text.startswith("yesterday's lines\n{") and text.rstrip().endswith("}")
    assert list(tmp_path.iterdir()) == [log]


def test_an_empty_output_name_is_refused_before_the_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *SAME, "-o", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "empty" in err


@pytest.mark.parametrize(("how", "below"), [("owned", ""), ("open", ""), ("owned", "run")])
def test_a_run_dir_another_user_can_write_or_holds_is_refused_before_the_run(
        tmp_path: Path, how: str, below: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = _others_folder(tmp_path, how)
    monkeypatch.setenv("GPUCHECK_RUN_DIR", str(folder / below))
    assert main(["compare", *SAME]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "GPUCHECK_RUN_DIR" in err
    assert "another user" in err or not below


READ_BACK = ("import sys\nfrom pathlib import Path\n"
             "from gpucheck.distributed.progress import read_run_dir\n"
             "print(read_run_dir(Path(sys.argv[1])))\n")


def test_a_fifo_or_a_link_to_dev_zero_in_the_run_dir_neither_holds_nor_crashes(
        tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "diagnosis-99.json")
    (tmp_path / "roster.json").symlink_to("/dev/zero")
    (tmp_path / "diagnosis-1.json").write_text('{"rank": 1}')
    proc = subprocess.run([sys.executable, "-c", READ_BACK, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(None, None, [{'rank': 1}])"


def test_a_link_inside_another_users_folder_cannot_aim_roots_write(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    aimed = tmp_path / "etc"
    aimed.mkdir(mode=0o755)  # root's own: the real path alone looks safe
    (_others_folder(tmp_path, "owned") / "d").symlink_to(aimed)
    assert main(["compare", *SAME, "-q", "-o", str(tmp_path / "owned" / "d" / "x.json")]) == 2
    assert "another user" in capsys.readouterr().err
    assert list(aimed.iterdir()) == []
