"""Environment variables that matter for GPU work, with secrets redacted.

Only names matching the allowlist are ever reported, and never gpucheck's own variables
(`GPUCHECK_*`: what gpucheck sets for its ranks, such as GPUCHECK_PROGRESS, 1 at a
terminal and 0 under cron, is no fact about the machine); of those, any whose name
looks secret is shown as `<redacted>`, and in every other value the credentials
it holds are replaced by `<redacted>` (`redact_value`): a password in a URL, a
JWT, a well-known token shape, a `token=` pair, a conda channel token.
`allowed_env` is reused by other commands.
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
    "TF32_",
)
# gpucheck's own variables (set by gpucheck for its ranks, or its test hooks): never the
# machine's environment, so never reported, compared between reports or called drift.
OWN_PREFIX = "GPUCHECK_"
ALLOWED_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE", "NO_COLOR",
})
SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL",
                "AUTH", "PRIVATE", "COOKIE", "SESSION", "SIGNATURE", "CERT", "JWT")
_SECRET_RE = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)


def is_allowed(name: str) -> bool:
    """True when `name` is one the env report may mention."""
    if is_own(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def is_own(name: str) -> bool:
    """True for gpucheck's own variables (GPUCHECK_PROGRESS, GPUCHECK_RUN_DIR, ...)."""
    return name.startswith(OWN_PREFIX)


def looks_secret(name: str) -> bool:
    """True when the name contains TOKEN, SECRET, KEY, PASSWORD, PASS, AUTH, ..."""
    return bool(_SECRET_RE.search(name))


# Secrets by value, wherever they sit in a value (a URL, a list, key=value pairs).
# Each pattern keeps what shows where the secret was and replaces the secret only.
_BOUNDARY = r"(?<![A-Za-z0-9_-])"
_VALUE_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host or scheme://token@host (RFC 3986 userinfo)
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@"), rf"\1{REDACTED}@"),
    # a JWT: three base64url parts, the first a JSON header ("eyJ" is '{"'); RFC 7519
    (re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), REDACTED),
    # token shapes their issuers document: GitHub (ghp_, gho_, ghu_, ghs_, ghr_,
    # github_pat_), Slack (xoxb-, xoxp-, ...), AWS access key ids (AKIA, ASIA), Hugging
    # Face (hf_), GitLab (glpat-), OpenAI/Anthropic-style (sk-), Google API (AIza),
    # npm (npm_), PyPI (pypi-)
    (re.compile(_BOUNDARY + r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                r"|xox[abposr]-[A-Za-z0-9-]{8,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
                r"|hf_[A-Za-z0-9]{20,}|glpat-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}"
                r"|AIza[0-9A-Za-z_-]{30,}|npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{30,})"),
     REDACTED),
    # name=value pairs whose name says secret: token=, password=, api_key=, sig=
    (re.compile(r"(?i)(\b[A-Za-z0-9_.-]*(?:token|passw(?:or)?d|pwd|secret|key|auth|"
                r"credential|signature|sig|jwt)[A-Za-z0-9_.-]*=)[^\s&;,]+"), rf"\1{REDACTED}"),
    # a token as a URL path segment: conda channels (https://conda.anaconda.org/t/<tk>/)
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s,;]*?/t/)[^/\s,;]+"), rf"\1{REDACTED}"),
)


def redact_value(value: str) -> str:
    """`value` with every credential it holds replaced by `<redacted>`."""
    for pattern, replacement in _VALUE_SECRETS:
        value = pattern.sub(replacement, value)
    return value


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Allowlisted variables, sorted by name (`env | sort`); a value is `<redacted>`
    when its name looks secret, else shown with the secrets it holds redacted."""
    environ = os.environ if environ is None else environ
    return {
        name: (REDACTED if looks_secret(name) else redact_value(value))
        for name, value in sorted(environ.items())
        if is_allowed(name)
    }


def probe_envvars(environ: Mapping[str, str] | None = None) -> Section:
    """The allowlisted environment as a section (no findings: it is context)."""
    return Section("environment", "Environment variables (allowlisted)",
                   {"variables": allowed_env(environ)})
