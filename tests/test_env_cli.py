"""`gpucheck env` through the CLI in a subprocess: formats, bad input, broken torch, secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {"NCCL_IB_PASSWORD": "hunter2-nccl-secret", "SLURM_JOB_TOKEN": "tok-9f8e7d",
           "CUDA_API_KEY": "cuda-key-1234", "MY_PRIVATE_NOTE": "not-allowlisted-value",
           "HOME_SECRET_THING": "outside-the-allowlist"}


def run_cli(*args: str, env: dict[str, str] | None = None,
            pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {}), "NO_COLOR": "1"}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)
    return subprocess.run([sys.executable, "-m", "gpucheck", *args], capture_output=True,
                          text=True, env=full_env, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quiet `gpucheck env` run with the secrets set, each format written with -o and
    chosen by the file's extension; {format: output, "proc": the process, "files": names}."""
    folder = tmp_path_factory.mktemp("formats")
    files = {"text": folder / "env.txt", "json": folder / "env.json",
             "markdown": folder / "env.md"}
    proc = run_cli("env", "--quiet", "--no-gpu-test",
                   *(a for f in files.values() for a in ("-o", str(f))),
                   env={**SECRETS, "NCCL_DEBUG": "WARN-visible"})
    assert proc.returncode in (0, 1), proc.stderr
    return {"proc": proc, "files": sorted(p.name for p in folder.iterdir()),
            **{fmt: path.read_text() for fmt, path in files.items()}}


def test_env_json_report_comes_out_and_parses(every_format: dict[str, Any]) -> None:
    report = json.loads(every_format["json"])
    assert report["command"] == "env"
    names = [s["name"] for s in report["sections"]]
    assert names[:3] == ["system", "python", "torch"] and "environment" in names
    assert every_format["proc"].returncode == (1 if report["verdict"] == "FAIL" else 0)


def test_output_files_take_their_format_from_the_extension_and_quiet_prints_nothing(
        every_format: dict[str, Any]) -> None:
    assert every_format["proc"].stdout == ""
    assert every_format["files"] == ["env.json", "env.md", "env.txt"]
    assert every_format["markdown"].startswith("# gpucheck env: **")
    assert every_format["text"].startswith("gpucheck env on ")


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_secrets_and_other_variables_never_appear_in_any_format(
        every_format: dict[str, Any], fmt: str) -> None:
    out = every_format[fmt]
    for value in SECRETS.values():
        assert value not in out and value not in every_format["proc"].stderr
    # Markdown escapes "<" (GitHub would swallow <redacted> as an HTML tag).
    marker = "&lt;redacted&gt;" if fmt == "markdown" else "<redacted>"
    assert marker in out and "WARN-visible" in out
    assert "MY_PRIVATE_NOTE" not in out


def test_broken_torch_still_gives_a_report_naming_the_error(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("simulated broken torch")\n')
    proc = run_cli("env", "--format", "json", "--no-gpu-test", pythonpath=str(tmp_path))
    report = json.loads(proc.stdout)
    failed = [f for s in report["sections"] for f in s["findings"]
              if f["status"] == "FAIL" and f["check"] == "torch.import"]
    assert failed and "simulated broken torch" in failed[0]["message"]
    assert proc.returncode == 1


@pytest.mark.parametrize("args, words", [
    (["--output", "{tmp}/missing-dir/report.json"], "--output"),
    (["--output", "{tmp}"], "is a directory"),
    (["--format", "yaml"], "yaml")], ids=["no such dir", "a directory", "unknown format"])
def test_a_bad_output_or_format_is_a_one_line_error_exit_2_and_writes_nothing(
        tmp_path, args, words):
    proc = run_cli("env", *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2 and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_importing_gpucheck_and_building_the_parser_never_imports_torch():
    code = ("import sys\n"
            + "import gpucheck.cli, gpucheck.commands.env, gpucheck.probes.runner\n"
            + "gpucheck.cli.build_parser()\n"
            + "assert 'torch' not in sys.modules, 'torch imported'\n"
            + "assert 'pynvml' not in sys.modules, 'pynvml imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_help_works_with_a_broken_torch(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('torch must not load')\n")
    proc = run_cli("env", "--help", pythonpath=str(tmp_path))
    assert proc.returncode == 0 and "--no-gpu-test" in proc.stdout
