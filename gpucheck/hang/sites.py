"""Where in its program a stack is: in a collective (which op, called from where) or
in the job's own code (which function, at which line).

A collective is a frame of torch/distributed/distributed_c10d.py, the module behind
every `torch.distributed.<op>`; the outermost such frame is the op the program
called (all_gather_object, not the all_gather it calls). The call site is the first
frame outside torch.distributed. "User code" is the innermost frame outside the
Python installation (site-packages, dist-packages, the standard library).
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass

from gpucheck.hang.stacks import Frame

C10D = "torch/distributed/distributed_c10d.py"
TORCH_DISTRIBUTED = "torch/distributed/"
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "<frozen ")
_STDLIB = sysconfig.get_paths().get("stdlib", "") or ""
# Another interpreter's standard library (the target may run another Python).
_ANY_STDLIB = re.compile(r"/lib/python3\.\d+/[^/]+\.py$|/lib/python3\.\d+/(?!site-)[a-z_]+/")


@dataclass(frozen=True)
class Site:
    """kind: collective or user (or unknown: no Python frame at all)."""

    kind: str
    op: str | None  # the collective (all_reduce), for kind collective
    where: str  # "function at file:line": the call site, or the user frame
    innermost: str  # the innermost frame, as seen

    def describe(self) -> str:
        if self.kind == "collective":
            return f"in {self.op} called from {self.where}"
        if self.kind == "user":
            return f"in user code: {self.where}" + (
                f" (innermost: {self.innermost})" if self.innermost != self.where else "")
        return "no Python frame (in native code or between frames)"


def _is_library(file: str) -> bool:
    if any(mark in file for mark in _LIBRARY_MARKS):
        return True
    return (bool(_STDLIB) and file.startswith(_STDLIB)) or bool(_ANY_STDLIB.search(file))


def _short(frame: Frame) -> str:
    return frame.where


def site_of(frames: tuple[Frame, ...]) -> Site:
    """The site of one stack (frames innermost first)."""
    if not frames:
        return Site("unknown", None, "no Python frame", "none")
    innermost = _short(frames[0])
    c10d = [i for i, f in enumerate(frames) if f.file.endswith(C10D)]
    if c10d:
        outer = c10d[-1]
        caller = next((f for f in frames[outer + 1:] if TORCH_DISTRIBUTED not in f.file),
                      frames[outer])
        return Site("collective", frames[outer].function, _short(caller), innermost)
    user = next((f for f in frames if not _is_library(f.file)), frames[0])
    return Site("user", None, _short(user), innermost)
