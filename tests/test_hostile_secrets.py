"""Environment values in every format: credentials inside allowlisted values never reach
any format, and a value that is not UTF-8 or holds escapes is shown escaped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.probes.system import REDACTED, allowed_env, redact_value

ROOT = Path(__file__).resolve().parents[1]
GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6MTcwMDAwMDAwMH0."
       "c2lnbmF0dXJlLXNlY3JldC12YWx1ZQ")
CONDA = "tk-9f8e7d6c-5b4a-3210"
SECRET_VALUES = ("s3cr3t-pass", GITHUB, JWT, CONDA, "AKIAIOSFODNN7EXAMPLE",
                 "hf_abcdefghijklmnopqrstuvwxyzABCD", "glpat-abcdefghijklmnopqrst",
                 "sk-proj-abcdefghijklmnopqrstuvwx", "xoxb-123456789012-abcdefghij",
                 "github_pat_11ABCDEFG0abcdefghijklmnopqrstuv", "pw-in-a-pair")
ENV = {
    "SLURM_JWT": JWT,
    "MASTER_ADDR": "https://alice:s3cr3t-pass@head.cluster:8443/",
    "NCCL_IB_HCA": f"mlx5_0:1,mlx5_1:1,{GITHUB}",
    "CONDA_CHANNELS": f"https://conda.anaconda.org/t/{CONDA}/pytorch,conda-forge",
    "NCCL_SOCKET_IFNAME": "eth0,AKIAIOSFODNN7EXAMPLE",
    "TORCH_HOME": "/opt/hf_abcdefghijklmnopqrstuvwxyzABCD",
    "CUDA_CACHE_PATH": "/cache/glpat-abcdefghijklmnopqrst",
    "GPUCHECK_NOTE": "sk-proj-abcdefghijklmnopqrstuvwx xoxb-123456789012-abcdefghij",
    "PYTHONPATH": f"{ROOT}:/x/github_pat_11ABCDEFG0abcdefghijklmnopqrstuv",
    "UCX_NET_DEVICES": "mlx5_0:1;password=pw-in-a-pair",
}


@pytest.mark.parametrize("value", [
    "mlx5_0:1,mlx5_1:1", "10.0.0.1", "head.cluster", "/usr/local/cuda/lib64:/opt/lib",
    "GPU-0a1b2c3d-1111-2222-3333-444455556666", "0,1,2,3", "WARN", "eth0", "/home/t/x",
    "https://download.pytorch.org/whl/cu124", "INIT,COLL", "PATH=/usr/bin",
])
def test_ordinary_values_are_left_as_they_are(value: str) -> None:
    assert redact_value(value) == value


@pytest.mark.parametrize(("value", "kept"), [
    ("https://alice:pw@head:8443/x", "https://<redacted>@head:8443/x"),
    ("tcp://tok@10.0.0.1:29500", "tcp://<redacted>@10.0.0.1:29500"),
    (f"mlx5_0,{GITHUB}", "mlx5_0,<redacted>"),
    ("a,token=abc123,b", "a,token=<redacted>,b"),
    ("https://h/x?api_key=abc&y=1", "https://h/x?api_key=<redacted>&y=1"),
    (f"https://conda.anaconda.org/t/{CONDA}/pytorch", "https://conda.anaconda.org/t/<redacted>/pytorch"),
    (JWT, REDACTED),
])
def test_secrets_inside_values_are_redacted_and_the_rest_kept(value: str, kept: str) -> None:
    assert redact_value(value) == kept


def test_a_jwt_name_is_secret_by_name_too() -> None:
    assert allowed_env({"SLURM_JWT": "anything"}) == {"SLURM_JWT": REDACTED}


# Not UTF-8 and a terminal escape: shown escaped, in valid UTF-8.
HOSTILE_IFNAME = b"eth\xff0\x1b]0;owned\x07"


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One `gpucheck env` run: text on stdout, the other formats written with -o (the
    same renderers), each read as strict UTF-8; {format: output, "stderr": stderr}."""
    folder = tmp_path_factory.mktemp("secrets")
    files = {"json": folder / "env.json", "markdown": folder / "env.md",
             "html": folder / "env.html"}
    env = {k.encode(): v.encode() for k, v in {**os.environ, **ENV, "NO_COLOR": "1"}.items()}
    env[b"GLOO_SOCKET_IFNAME"] = HOSTILE_IFNAME
    proc = subprocess.run([sys.executable, "-m", "gpucheck", "env", "--format", "text",
                           "--no-gpu-test", *(a for f in files.values() for a in ("-o", str(f)))],
                          capture_output=True, encoding="utf-8", env=env, cwd=ROOT,
                          timeout=180)
    assert proc.stdout and proc.returncode in (0, 1), proc.stderr
    return {"text": proc.stdout, "stderr": proc.stderr,
            **{fmt: path.read_text(encoding="utf-8") for fmt, path in files.items()}}


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_no_secret_value_leaks_into_any_format(every_format: dict[str, str], fmt: str) -> None:
    out, err = every_format[fmt], every_format["stderr"]
    for secret in SECRET_VALUES:
        assert secret not in out and secret not in err, secret
    assert "head.cluster" in out and "mlx5_1:1" in out  # the rest is shown


@pytest.mark.parametrize("fmt", ["text", "html"])
def test_an_environment_value_that_is_not_utf8_or_holds_escapes_is_printed_escaped(
        every_format: dict[str, str], fmt: str) -> None:
    assert "eth\\udcff0\\x1b]0;owned\\x07" in every_format[fmt]  # read as strict UTF-8
    assert "\x1b" not in every_format[fmt]
