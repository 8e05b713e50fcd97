"""Environment variables that matter for GPU work, with secrets redacted.

Only names matching the allowlist are ever reported; of those, any whose name
looks secret is shown as `<redacted>`. `allowed_env` is reused by other commands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from gpucheck.report import Section

REDACTED = "<redacted>"

ALLOWED_PREFIXES = (
    "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "SLURM_", "CONDA_",
    "NVIDIA_", "CUDNN_", "CUBLAS_", "TORCHELASTIC_", "GLOO_", "UCX_", "FI_", "HIP_", "ROCM_",
    "TF32_", "GPUCHECK_",
)
ALLOWED_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE", "NO_COLOR",
})
SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL",
                "AUTH", "PRIVATE", "COOKIE", "SESSION", "SIGNATURE", "CERT")
_SECRET_RE = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)


def is_allowed(name: str) -> bool:
    """True when `name` is one the env report may mention."""
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def looks_secret(name: str) -> bool:
    """True when the name contains TOKEN, SECRET, KEY, PASSWORD, PASS, AUTH, ..."""
    return bool(_SECRET_RE.search(name))


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Allowlisted variables, sorted by name, secret-looking values redacted (`env | sort`)."""
    environ = os.environ if environ is None else environ
    return {
        name: (REDACTED if looks_secret(name) else value)
        for name, value in sorted(environ.items())
        if is_allowed(name)
    }


def probe_envvars(environ: Mapping[str, str] | None = None) -> Section:
    """The allowlisted environment as a section (no findings: it is context)."""
    return Section("environment", "Environment variables (allowlisted)",
                   {"variables": allowed_env(environ)})
