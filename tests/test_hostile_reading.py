"""No read can hang or eat the machine: regular files only, sizes and gzip capped.

Every test runs under an alarm: a read that blocks (the bug) fails the test instead
of hanging the suite."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucheck.cli import main
from gpucheck.errors import UsageError
from gpucheck.inputs import MIB, REPORT_MAX_BYTES, InputError, read_capped
from gpucheck.probes import kernel_log
from gpucheck.probes.kernel_log import read_file

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
KERNEL_LOGS = Path(__file__).resolve().parent / "data" / "kernel_logs"


def _too_slow(signum: int, frame: object) -> None:
    raise TimeoutError("a read blocked: the input was not bounded")


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)  # nobody ever writes to it
    return path


BENCH = str(REPORTS / "bench.json")


@pytest.mark.parametrize(("argv", "kind"), [
    (["compare", "{}", BENCH], "FIFO"), (["fleet", BENCH, "--baseline", "{}"], "FIFO"),
    (["bench", "--baseline", "{}"], "FIFO"), (["env", "--kernel-log", "{}"], "FIFO"),
    (["env", "--kernel-log", "/dev/zero"], "character device"),
    (["env", "--kernel-log", "/dev/urandom"], "character device")])
def test_a_fifo_or_a_device_as_an_input_is_exit_2_in_one_line_at_once(
        fifo: Path, argv: list[str], kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(fifo) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and kind in err and "not a regular file" in err
    if argv[0] == "env":
        log = read_file(argv[-1])
        assert log.source is None and "not a regular file" in log.not_read[0]


def test_a_fifo_in_a_fleet_directory_is_an_unreadable_node_not_a_hang(
        fifo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(REPORTS / "bench.json", fifo.parent / "node1.json")
    assert main(["fleet", str(fifo.parent), "--format", "json"]) in (0, 1)
    out = capsys.readouterr().out
    assert '"fleet.unreadable"' in out and "pipe.json" in out and "FIFO" in out


def test_a_gzip_kernel_log_is_read_and_a_bomb_or_a_damaged_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = tmp_path / "kern.log.gz"
    packed.write_bytes(gzip.compress((KERNEL_LOGS / "dmesg_fallen_off_bus.log").read_bytes()))
    log = read_file(str(packed))
    assert log.source == str(packed) and log.events
    monkeypatch.setattr(kernel_log, "MAX_READ_BYTES", 4 * MIB)
    bomb = tmp_path / "bomb.log.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        for _ in range(64):  # 64 MiB of zeros in ~64 KiB of gzip
            out.write(bytes(MIB))
    assert bomb.stat().st_size < MIB
    log = read_file(str(bomb))
    assert log.source is None and "decompresses to more than 4 MiB" in log.not_read[0]
    broken = tmp_path / "k.gz"
    broken.write_bytes(gzip.compress(b"NVRM: Xid\n" * 1000)[:-40] + b"\xff" * 40)
    log = read_file(str(broken))
    assert log.source is None and log.not_read


def test_a_report_over_the_size_cap_is_refused_and_a_symlinked_one_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:
        out.truncate(REPORT_MAX_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(InputError, match="larger than 32 MiB"):
        read_capped(str(huge))
    assert main(["compare", str(huge), BENCH]) == 2
    assert "larger than 32 MiB" in capsys.readouterr().err
    link = tmp_path / "a.json"
    link.symlink_to(REPORTS / "bench.json")
    assert main(["compare", str(link), BENCH, "-q"]) == 0


def test_a_decompression_bomb_image_is_skipped_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from gpucheck.bench.model import default_images_dir, scan_images

    images = tmp_path / "images"
    images.mkdir()
    first = sorted(p for p in Path(default_images_dir()).iterdir()
                   if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[0]
    shutil.copy(first, images / first.name)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # any real image is a "bomb" now
    with pytest.raises(UsageError, match="no readable image"):
        scan_images(str(images))
    monkeypatch.undo()
    assert scan_images(str(images)).files == (first.name,)


def test_fleet_bounds_what_all_its_reports_hold_together(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads((REPORTS / "bench.json").read_text())
    raw["sections"][0]["data"]["pad"] = [{}] * 1_100_000  # 3.3 MB: well under 32 MiB
    for n in range(4):  # 4.4 million objects in all, each a Python dict once parsed
        raw["host"] = f"gpu{n:02d}"
        (tmp_path / f"n{n}.json").write_text(json.dumps(raw, separators=(",", ":")))
    assert main(["fleet", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fewer files" in err
