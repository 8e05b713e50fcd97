"""System probe: OS, kernel, CPU, memory, /dev/shm, container (no subprocesses)."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

from gpucheck.report import Finding, Section, fail, ok, skip, warn

GIB = 1024**3
SHM_MIN_BYTES = 1 * GIB


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """Key/value pairs of /etc/os-release (`cat /etc/os-release`); empty when absent."""
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
    """A cheap guess: docker, podman, kubernetes, or a container cgroup; None when bare."""
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
