"""What torch was built with and what it loaded: the PyTorch build probe (`import torch`
happens inside it, never at import of gpucheck; the build part of `python -m
torch.utils.collect_env`), and the NCCL this process really mapped (docs/env.md)."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.devices import cuda_device_count
from gpucheck.report import Finding, Section, fail, ok, skip, warn


@dataclass(frozen=True)
class TorchInfo:
    """What the torch probe learnt; `error` is set when `import torch` failed."""

    version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    init_error: str | None = None
    error: str | None = None
    arch_list: tuple[str, ...] = field(default_factory=tuple)

    @property
    def imported(self) -> bool:
        return self.error is None


def import_torch() -> Any:
    """`import torch`; any exception propagates."""
    import torch

    return torch


def _call(fn: Any, default: Any = None) -> Any:
    """A build query that must not sink the probe (old torch lacks some of them)."""
    try:
        return fn()
    except Exception:
        return default


def read_torch(torch: Any) -> TorchInfo:
    available = bool(_call(torch.cuda.is_available, False))
    init_error = None
    if not available and torch.version.cuda is not None:
        try:
            torch.cuda.init()
        except Exception as exc:
            init_error = f"{type(exc).__name__}: {exc}".strip()
    # torch's kernels ('sm_90', 'compute_120', ...); the compiled-in flags where
    # `get_arch_list()` answers [] without CUDA.
    arch_list = _call(torch.cuda.get_arch_list, []) or []
    if not arch_list:
        flags = _call(getattr(torch._C, "_cuda_getArchFlags", lambda: None))
        arch_list = str(flags).split() if flags else []
    return TorchInfo(version=str(torch.__version__), cuda=torch.version.cuda,
                     hip=getattr(torch.version, "hip", None), cuda_available=available,
                     device_count=cuda_device_count(torch) if available else 0,
                     init_error=init_error, arch_list=tuple(str(a) for a in arch_list))


def torch_data(torch: Any, info: TorchInfo) -> dict[str, Any]:
    nccl = _call(lambda: torch.cuda.nccl.version())  # the headers torch was built against
    if isinstance(nccl, tuple):
        nccl = ".".join(str(v) for v in nccl)
    dist = torch.distributed
    backends = ("nccl", "gloo", "mpi", "ucc") if _call(dist.is_available, False) else ()
    loaded = loaded_nccl()
    return {
        "version": info.version,
        "file": getattr(torch, "__file__", None),
        "debug": bool(getattr(torch.version, "debug", False)),
        "cuda_build_version": info.cuda,
        "hip_version": info.hip,
        "cudnn_version": _call(torch.backends.cudnn.version),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "nccl_version": None if nccl is None else str(nccl),
        "nccl_loaded_version": loaded.version, "nccl_loaded_path": loaded.path,
        "nccl_loaded_note": loaded.why,
        "distributed_backends": [b for b in backends if _call(getattr(
            dist, f"is_{b}_available", lambda: False))],
        "cuda_arch_list": list(info.arch_list),
        "cuda_available": info.cuda_available,
        "cuda_device_count": info.device_count,
    }


def build_findings(info: TorchInfo, data: dict[str, Any]) -> list[Finding]:
    findings = [ok("torch.import", f"torch {info.version} imported")]
    if info.cuda is None and info.hip is None:
        findings.append(warn("torch.build", "this torch is a CPU-only build",
                             "install a CUDA build of torch (https://pytorch.org/get-started/)"))
        return findings
    if data["cudnn_version"] is None:
        findings.append(warn("torch.cudnn", "torch could not load cuDNN",
                             "reinstall torch with its nvidia-cudnn wheel"))
    if info.cuda is not None and "nccl" not in data["distributed_backends"]:
        findings.append(warn("torch.nccl", "this CUDA torch has no NCCL backend",
                             "install a torch build with NCCL for multi-GPU training"))
    findings.append(nccl_loaded_finding(data))
    return findings


def nccl_loaded_finding(data: dict[str, Any]) -> Finding:
    """The NCCL this process loaded beside the build's: a difference is said, not judged
    (NCCL keeps its ABI within a major version)."""
    loaded, path, build = (data.get("nccl_loaded_version"), data.get("nccl_loaded_path"),
                           data.get("nccl_version"))
    if loaded is None:
        return skip("torch.nccl_loaded", data.get("nccl_loaded_note") or "no NCCL loaded")
    differs = f", not the {build} torch was built against" if build and build != loaded \
        else ", as torch was built against" if build else ""
    return ok("torch.nccl_loaded", f"NCCL {loaded} loaded from {path}{differs}")


def probe_torch() -> tuple[Section, TorchInfo]:
    try:
        torch = import_torch()
    except BaseException as exc:  # a broken torch may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        error = f"{type(exc).__name__}: {exc}"
        info = TorchInfo(error=error)
        finding = fail("torch.import", f"import torch failed: {error}",
                       "reinstall torch in this environment (pip install --force-reinstall "
                       "torch) and check that nothing on PYTHONPATH shadows it")
        return Section("torch", "PyTorch build", {"import_error": error}, [finding]), info
    info = read_torch(torch)
    data = torch_data(torch, info)
    return Section("torch", "PyTorch build", data, build_findings(info, data)), info


def well_formed(entry: str) -> bool:
    return entry.startswith(("GPU-", "MIG-")) or entry.isdigit()


def cuda_unavailable_reason(info: TorchInfo, driver_present: bool | None,
                            driver_cuda: str | None, environ: dict[str, str]) -> str:
    """The most likely reason `torch.cuda.is_available()` is False, in plain words."""
    if info.cuda is None and info.hip is None:
        return "this torch is a CPU-only build"
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and not well_formed(cvd.split(",")[0].strip()):  # CUDA parses none
        return f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU"
    if driver_present is False:
        return "no NVIDIA driver is installed or loaded on this machine"
    if driver_cuda and info.cuda and version_tuple(driver_cuda)[0] < version_tuple(info.cuda)[0]:
        return (f"the driver supports CUDA up to {driver_cuda} but torch was built with "
                f"CUDA {info.cuda}: the driver is older than the build needs")
    return info.init_error or "torch could not initialise CUDA (no further detail)"


def version_tuple(version: str) -> tuple[int, int]:
    """"12.4" -> (12, 4); (0, 0) where it is not a version."""
    parts = ([*version.split("."), "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return 0, 0


def cuda_available_finding(info: TorchInfo, driver_present: bool | None,
                           driver_cuda: str | None, gpus_present: bool,
                           environ: dict[str, str] | None = None) -> Finding:
    """`torch.cuda.is_available()`, with the reason when it is False."""
    environ = dict(os.environ if environ is None else environ)
    if not info.imported:
        return skip("torch.cuda_available", "torch did not import")
    if info.cuda_available:
        return ok("torch.cuda_available", f"CUDA available, {info.device_count} device(s)")
    reason = cuda_unavailable_reason(info, driver_present, driver_cuda, environ)
    message = f"torch.cuda.is_available() is False: {reason}"
    if not gpus_present:
        return skip("torch.cuda_available", f"{message} (no NVIDIA GPU on this machine)")
    return fail("torch.cuda_available", message, _reason_hint(reason))


# CUDA error 802, cudaErrorSystemNotReady: on NVSwitch systems (HGX H100/H200/B200) CUDA
# refuses to start until the fabric manager has registered every GPU in the fabric.
FABRIC_NOT_READY = ("system not yet initialized", "error 802", "cudaErrorSystemNotReady")


def _reason_hint(reason: str) -> str:
    if any(words.lower() in reason.lower() for words in FABRIC_NOT_READY):
        return ("CUDA error 802: the NVSwitch fabric is not ready. Start the fabric manager "
                "(systemctl start nvidia-fabricmanager; its version must match the driver) "
                "and wait for fabric registration (nvidia-smi -q | grep -A2 Fabric)")
    if "CPU-only" in reason:
        return "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"
    if "CUDA_VISIBLE_DEVICES" in reason:
        return "unset CUDA_VISIBLE_DEVICES or list the GPU indices you want"
    if "older than" in reason:
        return "upgrade the NVIDIA driver, or install a torch built for an older CUDA"
    if "no NVIDIA driver" in reason:
        return "install the NVIDIA driver (or start the container with --gpus all)"
    return "run nvidia-smi; check dmesg for Xid errors; reboot after a driver upgrade"


# ---- the NCCL this process loaded: its path from /proc/self/maps, its version from the
# mapped library's own ncclGetVersion (RTLD_NOLOAD: nothing new is loaded) ----

MAPS = Path("/proc/self/maps")
# libnccl.so, libnccl.so.2, libnccl.so.2.21.5; not libnccl-net.so (a network plugin).
NCCL_NAME = re.compile(r"^libnccl\.so(\.\d+)*$")


@dataclass(frozen=True)
class LoadedLibrary:
    """A library mapped in this process and its version; `why` says what is missing."""

    path: str | None
    version: str | None
    why: str | None = None


def mapped_paths(pattern: re.Pattern[str], maps: Path = MAPS) -> list[str]:
    """Mapped files whose name matches `pattern`, in map order, once each."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found: list[str] = []
    for line in text.splitlines():
        fields = line.split(None, 5)  # address perms offset dev inode [path]
        if len(fields) < 6:
            continue
        path = fields[5].strip()
        if path.startswith("/") and pattern.match(Path(path).name) and path not in found:
            found.append(path)
    return found


def nccl_version_text(code: int) -> str:
    """ncclGetVersion's integer as "2.21.5" (major*10000 since 2.9, major*1000 before)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


Opener = Callable[[str], Any]


def already_loaded(path: str) -> Any:
    """The library only if this process has it loaded already (RTLD_NOLOAD)."""
    return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)


def loaded_nccl(maps: Path = MAPS, opener: Opener = already_loaded) -> LoadedLibrary:
    paths = mapped_paths(NCCL_NAME, maps)
    if not paths:
        return LoadedLibrary(None, None, "no libnccl is loaded in this process (a CPU-only "
                             "torch, or torch without NCCL)")
    try:
        lib = opener(paths[0])
    except OSError as exc:
        return LoadedLibrary(paths[0], None, f"{paths[0]} is mapped but could not be opened: "
                             f"{exc}")
    get = getattr(lib, "ncclGetVersion", None)
    if get is None:
        return LoadedLibrary(paths[0], None, f"{paths[0]} has no ncclGetVersion")
    code = ctypes.c_int(0)
    result = int(get(ctypes.byref(code)))
    if result != 0:
        return LoadedLibrary(paths[0], None, f"ncclGetVersion returned error {result}")
    extra = f"; also mapped: {', '.join(paths[1:])}" if len(paths) > 1 else None
    return LoadedLibrary(paths[0], nccl_version_text(code.value), extra)
