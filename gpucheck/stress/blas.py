"""The cuBLAS this process actually runs, and the settings that change its kernels.

Bit-identical products are only promised within one cuBLAS version, one GPU
architecture and SM count, and the same settings (the cuBLAS guide, "Results
reproducibility"): the workspace size (`CUBLAS_WORKSPACE_CONFIG`, torch's workspace
setters) and the library torch prefers (`TORCH_BLAS_PREFER_CUBLASLT`,
`torch.backends.cuda.preferred_blas_library()`) all change which kernel runs.
`torch.version.cuda` is the toolkit torch was built with, not the libcublas that a
newer `nvidia-cublas` wheel or `LD_LIBRARY_PATH` brought in, so the version is read
from the library mapped in this process (its path from /proc/self/maps, the
process's own mappings), with `cublasGetProperty` and `cublasLtGetVersion`, neither
of which needs a GPU or a handle. On the command line: `ldd` / `lsof -p PID | grep
cublas` show the same file.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAPS = "/proc/self/maps"
# libraryPropertyType (library_types.h): MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
_PROPERTIES = (0, 1, 2)
# Environment variables read by cuBLAS or torch that change the kernel choice; their
# values are shown (CUBLAS_ and TORCH_ are on gpucheck.probes.system' allowlist).
SETTINGS_VARS = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                 "TORCH_BLAS_PREFER_CUBLASLT")


@dataclass(frozen=True)
class Blas:
    """What decides the GEMM kernels beyond the GPU model: versions and settings."""

    cublas: str | None  # "13.1.1" read from the loaded library, None when unknown
    cublaslt: str | None  # cublasLtGetVersion(), e.g. "130101"
    path: str | None  # the libcublas file mapped in this process
    why_unknown: str | None  # why `cublas` is None
    settings: tuple[tuple[str, str], ...]  # (name, value) of what was set

    def key(self) -> str:
        """The part of a kernel group that these make (stable text, sorted settings)."""
        version = f"cuBLAS {self.cublas}" if self.cublas else "cuBLAS unknown"
        if self.cublaslt:
            version += f" (Lt {self.cublaslt})"
        return ", ".join([version, *(f"{k}={v}" for k, v in self.settings)])


def mapped_library(stem: str, maps: str = MAPS) -> str | None:
    """The path of the first file mapped in this process whose name starts with `stem`
    ("libcublas.so", "libcublasLt.so"); None when none is."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(maxsplit=5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        return None
    return None


def _already_loaded(path: str) -> Any:
    """The library only if this process has it loaded (RTLD_NOLOAD): a file replaced on
    disk since is never loaded, and nothing new runs."""
    return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)


def library_version(path: str, loader: Callable[[str], Any] = _already_loaded,
                    ) -> tuple[str | None, str | None]:
    """(major.minor.patch, None) from `cublasGetProperty`, or (None, why)."""
    try:
        lib = loader(path)
    except OSError as exc:
        return None, f"could not open {os.path.basename(path)}: {exc}"
    function = getattr(lib, "cublasGetProperty", None)
    if function is None:
        return None, f"{os.path.basename(path)} has no cublasGetProperty"
    parts = []
    for prop in _PROPERTIES:
        value = ctypes.c_int(-1)
        status = function(prop, ctypes.byref(value))
        if status != 0:
            return None, f"cublasGetProperty({prop}) returned status {status}"
        parts.append(str(value.value))
    return ".".join(parts), None


def lt_version(path: str | None, loader: Callable[[str], Any] = _already_loaded,
               ) -> str | None:
    """cublasLtGetVersion() of the mapped libcublasLt, or None."""
    if path is None:
        return None
    try:
        function = getattr(loader(path), "cublasLtGetVersion", None)
    except OSError:
        return None
    if function is None:
        return None
    function.restype = ctypes.c_size_t
    return str(function())


def torch_settings(torch: Any) -> list[tuple[str, str]]:
    """torch's own choices: the preferred BLAS library and the workspace sizes (these
    functions are private; a torch without one shows that it was not read)."""
    found = []
    prefer = getattr(torch.backends.cuda, "preferred_blas_library", None)
    found.append(("torch blas", str(prefer()).rsplit(".", 1)[-1] if prefer else "not read"))
    for name, label in (("_cuda_getCublasWorkspaceSize", "workspace bytes"),
                        ("_cuda_getCublasLtWorkspaceSize", "Lt workspace bytes")):
        getter = getattr(torch._C, name, None)
        found.append((label, _read(getter) if getter is not None else "not read"))
    return found


def _read(getter: Callable[[], Any]) -> str:
    """A torch getter's answer; its error's first words when CUDA refuses (a broken
    driver is the fault watch's and env's to report, not a reason to stop here)."""
    try:
        return str(getter())
    except RuntimeError as exc:  # a message may be empty: its type then
        words = str(exc).strip().splitlines() or [type(exc).__name__]
        return f"not read ({words[0][:80]})"


def loaded_blas(torch: Any | None = None, environ: dict[str, str] | None = None,
                maps: str = MAPS) -> Blas:
    """The cuBLAS mapped in this process and the settings in force (call after the
    first product on the GPU: torch loads cuBLAS and sizes its workspace lazily)."""
    env = os.environ if environ is None else environ
    settings = [(name, env[name]) for name in SETTINGS_VARS if name in env]
    if torch is not None:
        settings += torch_settings(torch)
    path = mapped_library("libcublas.so", maps)
    if path is None:
        return Blas(None, None, None, "no libcublas is mapped in this process",
                    tuple(settings))
    version, why = library_version(path)
    return Blas(version, lt_version(mapped_library("libcublasLt.so", maps)), path, why,
                tuple(settings))
