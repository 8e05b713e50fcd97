"""Which NCCL this process actually loaded, and its version.

`torch.cuda.nccl.version()` answers with the NCCL_MAJOR/MINOR/PATCH macros of the
headers torch was built against (torch's `csrc/cuda/nccl.cpp`); the library the
dynamic loader mapped can be another one: a newer `nvidia-nccl` wheel, a site NCCL
in LD_LIBRARY_PATH, or one in LD_PRELOAD. So the path comes from this process's own
memory map (`/proc/self/maps`: written by the kernel about this process, not by any
user) and the version from the mapped library itself (`ncclGetVersion`), called through
ctypes on the object already loaded (RTLD_NOLOAD: a file replaced on disk since is
never loaded, and nothing new runs). cuBLAS is read the same way by
`gpucheck.stress.blas`.

The same thing by hand: `grep nccl /proc/<pid>/maps` for a running rank, and
`NCCL_DEBUG=VERSION` (NCCL prints "NCCL version 2.21.5+cuda12.4" at its first init).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAPS = Path("/proc/self/maps")
# libnccl.so, libnccl.so.2, libnccl.so.2.21.5; not libnccl-net.so (a network plugin).
NCCL_NAME = re.compile(r"^libnccl\.so(\.\d+)*$")


@dataclass(frozen=True)
class LoadedLibrary:
    """One shared library as mapped in this process: its path and the version it reports.

    `path` None: no such library is mapped (`why` says so); `version` None with a path:
    it is mapped but would not say its version (`why` says what went wrong)."""

    path: str | None
    version: str | None
    why: str | None = None


def mapped_paths(pattern: re.Pattern[str], maps: Path = MAPS) -> list[str]:
    """Paths of the mapped files whose name matches `pattern`, in map order, once each."""
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
    """ncclGetVersion's integer as "2.21.5": NCCL_VERSION_CODE is major*10000 + minor*100
    + patch since 2.9 (major*1000 + minor*100 + patch before; nccl.h.in)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


Opener = Callable[[str], Any]


def already_loaded(path: str) -> Any:
    """The library only if this process has it loaded already (RTLD_NOLOAD)."""
    return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)


def _open(path: str, opener: Opener) -> tuple[Any, str | None]:
    try:
        return opener(path), None
    except OSError as exc:
        return None, f"{path} is mapped but could not be opened: {exc}"


def loaded_nccl(maps: Path = MAPS, opener: Opener = already_loaded) -> LoadedLibrary:
    """The libnccl mapped in this process and its `ncclGetVersion`."""
    paths = mapped_paths(NCCL_NAME, maps)
    if not paths:
        return LoadedLibrary(None, None, "no libnccl is loaded in this process (a CPU-only "
                             "torch, or torch without NCCL)")
    lib, why = _open(paths[0], opener)
    if lib is None:
        return LoadedLibrary(paths[0], None, why)
    get = getattr(lib, "ncclGetVersion", None)
    if get is None:
        return LoadedLibrary(paths[0], None, f"{paths[0]} has no ncclGetVersion")
    code = ctypes.c_int(0)
    result = int(get(ctypes.byref(code)))
    if result != 0:
        return LoadedLibrary(paths[0], None, f"ncclGetVersion returned error {result}")
    extra = f"; also mapped: {', '.join(paths[1:])}" if len(paths) > 1 else None
    return LoadedLibrary(paths[0], nccl_version_text(code.value), extra)
