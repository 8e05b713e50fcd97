"""Bad input to `gpucheck bench`: a one-line error saying what to do, exit 2, no process left."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import bench_workers
import pytest
from plant import Plant, planted

from gpucheck.bench.model import default_images_dir
from gpucheck.cli import main

FAST = ["--model", "mobilenet_v3_small", "--iters", "1", "--warmup", "0", "--batch-size", "1"]


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    yield
    import psutil

    children = psutil.Process().children(recursive=True)
    assert not [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command; it must exit 2 with one line on stderr, which is returned."""
    code = main(["bench", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpucheck bench: error:")
    return lines[0]


def test_more_gpus_than_visible_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.commands import launch

    monkeypatch.setattr(launch, "_visible_gpus", lambda ctx: 2)
    line = usage_error(capsys, "--n-gpus", "4", "--device", "cuda")
    assert "only 2 GPU" in line


def test_cuda_without_a_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.commands import launch

    monkeypatch.setattr(launch, "_visible_gpus", lambda ctx: 0)
    assert "--device cpu" in usage_error(capsys, "--device", "cuda")


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "resnet" in usage_error(capsys, "--model", "resnet5000")


def test_unknown_dtype_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    said = usage_error(capsys, "--dtype", "fp8")
    assert all(f"'{name}'" in said for name in ("auto", "fp32", "fp16", "bf16"))


def test_missing_images_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    assert "no such folder" in usage_error(capsys, "--images", str(tmp_path / "nope"))


def test_empty_images_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    assert "no readable image" in usage_error(capsys, "--images", str(tmp_path))


def test_folder_of_broken_files_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xffbroken")
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    assert "2 file(s) skipped" in usage_error(capsys, "--images", str(tmp_path))


def test_unwritable_output_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    assert "does not exist" in usage_error(capsys, "--output", str(tmp_path / "no" / "r.json"))


def test_port_in_use_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = str(sock.getsockname()[1])
        assert "in use" in usage_error(capsys, "--master-port", port)


def test_missing_weights_file_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    assert "no such file" in usage_error(capsys, "--weights", str(tmp_path / "w.pt"))


@pytest.mark.parametrize("content", [
    bytes(range(256)) * 64,  # random-looking bytes: torch.load raises UnpicklingError
    b"layer1.weight = 0.5\nnot a checkpoint\n",  # a text file: torch.load raises KeyError
    b"",  # an empty file: EOFError
], ids=["binary", "text", "empty"])
def test_a_weights_file_torch_cannot_read_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "w.pt"
    path.write_bytes(content)
    line = usage_error(capsys, "--weights", str(path))
    assert str(path) in line and "torch.save(model.state_dict(), path)" in line


def test_a_weights_file_holding_no_state_dict_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import torch

    path = tmp_path / "w.pt"
    torch.save(torch.zeros(3), path)
    assert "holds a Tensor, not a state_dict" in usage_error(capsys, "--weights", str(path))


def test_imagenet_weights_offline_say_how_to_get_them(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache
    assert "--download" in usage_error(capsys, "--weights", "imagenet")


def test_n_gpus_disagreeing_with_torchrun_world_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "disagrees" in usage_error(capsys, "--n-gpus", "3")


def test_saved_state_dict_is_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    import torchvision

    path = tmp_path / "w.pt"
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), path)
    assert main(["bench", "--n-gpus", "1", "--weights", str(path), *FAST]) == 0
    assert "weights" in capsys.readouterr().out
    assert "does not load" in usage_error(capsys, "--weights", str(path), "--model", "resnet18")


def test_broken_and_grayscale_images_run_with_a_warning_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("camera.png", "horse.png"):  # grayscale and RGBA
        shutil.copy(default_images_dir() / name, tmp_path / name)
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xffbroken")
    code = main(["bench", "--n-gpus", "1", "--images", str(tmp_path), *FAST])
    out = capsys.readouterr().out
    assert code == 0
    assert "[WARN] bench.images.skipped (broken.jpg)" in out


def test_duration_picks_the_iteration_count_from_the_warm_up(tmp_path: Path) -> None:
    import json

    out = tmp_path / "r.json"
    argv = ["bench", "--n-gpus", "1", "--model", "mobilenet_v3_small", "--batch-size", "1",
            "--duration", "0.2", "--quiet", "--output", str(out)]
    assert main(argv) == 0
    setup = next(s for s in json.loads(out.read_text())["sections"] if s["name"] == "bench")
    assert setup["data"]["timed_iters"] >= 1 and setup["data"]["warmup_iters"] >= 2


def test_a_failing_rank_becomes_a_report_not_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    with planted(Plant(model=bench_workers.fail_rank_zero)):
        assert main(["bench", "--n-gpus", "1", *FAST, "--warmup", "1"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] bench.rank_failed (rank 0)" in out
    assert "simulated device fault" in " ".join(out.split())  # the text report wraps lines
