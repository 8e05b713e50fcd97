"""The machine around the GPUs: OS, kernel, CPU, memory, /dev/shm and container (no
subprocesses); the allowlisted environment variables with secrets redacted; PyTorch's own
`python -m torch.utils.collect_env`, verbatim, for a PyTorch issue (docs/env.md)."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from gpucheck.envfacts import OWN_PREFIX  # gpucheck's own variables: never reported
from gpucheck.report import Finding, Section, fail, ok, skip, warn

GIB = 1024**3
SHM_MIN_BYTES = 1 * GIB


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """`cat /etc/os-release` as key/value pairs; empty when absent."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            pairs[key.strip()] = value.strip().strip('"').strip("'")
    return pairs


def cpu_model(path: str = "/proc/cpuinfo") -> str | None:
    """The first `model name` in /proc/cpuinfo (`lscpu | grep 'Model name'`)."""
    try:
        for line in Path(path).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        return None
    return platform.processor() or None


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """MemTotal / MemAvailable in bytes (`free -b`)."""
    values: dict[str, int] = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if key in ("MemTotal", "MemAvailable") and parts:
                values[key] = int(parts[0]) * 1024
    except (OSError, ValueError):
        return {}
    return values


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of /dev/shm (`df -B1 /dev/shm`); None when it does not exist."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def detect_container() -> str | None:
    """A cheap guess: docker, podman, kubernetes, a container cgroup; None when bare."""
    if Path("/.dockerenv").exists():
        return "docker"
    if Path("/run/.containerenv").exists():
        return "podman"
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        return "kubernetes"
    try:
        cgroup = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return None
    for marker in ("docker", "kubepods", "containerd", "lxc"):
        if marker in cgroup:
            return marker
    return None


def shm_finding(size: int | None) -> Finding:
    if size is None:
        return fail("system.shm", "/dev/shm does not exist",
                    "mount a tmpfs on /dev/shm (docker: --shm-size=16g or --ipc=host)")
    gib = size / GIB
    if size < SHM_MIN_BYTES:
        return warn("system.shm", f"/dev/shm is only {gib:.2f} GiB: DataLoader workers and "
                    "NCCL fail with 'bus error' or shm errors in small-shm containers",
                    "give the container more shared memory (docker: --shm-size=16g or "
                    "--ipc=host; kubernetes: an emptyDir with medium: Memory)")
    return ok("system.shm", f"/dev/shm is {gib:.1f} GiB")


def probe_system() -> Section:
    """OS, kernel, CPU and memory (`uname -a; lscpu; free -b; df /dev/shm`)."""
    release = read_os_release()
    uname = platform.uname()
    mem = meminfo()
    shm = shm_bytes()
    data = {
        "os": release.get("PRETTY_NAME") or uname.system,
        "kernel": uname.release,
        "architecture": uname.machine,
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_logical_cores": os.cpu_count(),
        "cpu_usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "memory_total_bytes": mem.get("MemTotal"),
        "memory_available_bytes": mem.get("MemAvailable"),
        "shm_total_bytes": shm,
        "container": detect_container(),
    }
    findings = [shm_finding(shm)]
    if not mem:
        findings.append(skip("system.memory", "/proc/meminfo is not readable"))
    return Section("system", "System", data, findings)


# ---- environment variables ----

REDACTED = "<redacted>"

ALLOWED_PREFIXES = (
    "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "SLURM_", "CONDA_",
    "NVIDIA_", "CUDNN_", "CUBLAS_", "TORCHELASTIC_", "GLOO_", "UCX_", "FI_", "HIP_", "ROCM_",
    "TF32_",
)
ALLOWED_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE", "NO_COLOR",
})
SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL",
                "AUTH", "PRIVATE", "COOKIE", "SESSION", "SIGNATURE", "CERT", "JWT")
_SECRET_RE = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)


# Secrets by value, wherever they sit; each pattern replaces the secret only.
_BOUNDARY = r"(?<![A-Za-z0-9_-])"
_VALUE_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host or scheme://token@host (RFC 3986 userinfo)
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@"), rf"\1{REDACTED}@"),
    # a JWT: three base64url parts, the first a JSON header ("eyJ" is '{"'); RFC 7519
    (re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), REDACTED),
    # token shapes their issuers document (GitHub, Slack, AWS, Hugging Face, GitLab,
    # sk-, Google API, npm, PyPI)
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
    for pattern, replacement in _VALUE_SECRETS:
        value = pattern.sub(replacement, value)
    return value


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Allowlisted variables, sorted; `<redacted>` when the name looks secret, else the
    value with its secrets redacted."""
    environ = os.environ if environ is None else environ
    return {name: REDACTED if _SECRET_RE.search(name) else redact_value(value)
            for name, value in sorted(environ.items())
            if not name.startswith(OWN_PREFIX)
            and (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES))}


def probe_envvars(environ: Mapping[str, str] | None = None) -> Section:
    """The allowlisted environment as a section (no findings: it is context)."""
    return Section("environment", "Environment variables (allowlisted)",
                   {"variables": allowed_env(environ)})


# ---- collect_env ----

COMMAND = (sys.executable, "-m", "torch.utils.collect_env")
TIMEOUT_S = 60.0
MAX_CHARS = 64_000  # a report field, not a log: PyTorch's output is ~5 kB


def collect_env_section(timeout_s: float = TIMEOUT_S,
                        command: tuple[str, ...] = COMMAND) -> Section:
    """`python -m torch.utils.collect_env`'s stdout, or a SKIP saying why there is none."""
    shown = "python -m torch.utils.collect_env"
    data: dict[str, object] = {"command": shown}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return _skipped(data, f"{shown} did not finish within {timeout_s:g} s")
    except OSError as exc:
        return _skipped(data, f"{shown} could not start: {exc.strerror or exc}")
    output = done.stdout.strip()
    if done.returncode != 0 or not output:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return _skipped(data, f"{shown} exited with status {done.returncode}: {last}")
    data["collect_env_output"] = output[:MAX_CHARS] + "\n"
    return Section("collect_env", "PyTorch's collect_env (for a PyTorch issue)", data)


def _skipped(data: dict[str, object], why: str) -> Section:
    return Section("collect_env", "PyTorch's collect_env (for a PyTorch issue)", data,
                   [skip("env.collect_env", why)])
