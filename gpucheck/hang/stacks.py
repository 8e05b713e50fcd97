"""A rank's Python stack through py-spy (never pausing it, every call bounded), and where
in its program a stack is: in a collective (which op, called from where) or in the
job's own code (docs/hang.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DUMP_TIMEOUT_S = 5.0
RECORD_RATE_HZ = 50
# py-spy writes its raw file after the window; a few seconds more is a py-spy that is
# stuck (a target it cannot read), never a slow one.
RECORD_GRACE_S = 3.0
# The raw file holds one line per distinct stack: a few KB for a rank. A target's own
# stacks (deep recursion, huge file names) must not fill gpucheck's memory.
MAX_RAW_BYTES = 8 << 20
PTRACE_CAPABILITY = ("the capability to read other processes' memory: run as the job's "
                     "user or root with CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; "
                     "Kubernetes securityContext.capabilities.add: [SYS_PTRACE]) and "
                     "kernel.yama.ptrace_scope at most 1 (sysctl kernel.yama.ptrace_scope)")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # as py-spy gives it (dump: full path; record: package-relative)
    line: int

    @property
    def where(self) -> str:
        """`function at file:line`; an installed package's file from its package folder
        (torch/distributed/distributed_c10d.py), the job's own files in full."""
        file = self.file
        for mark in ("/site-packages/", "/dist-packages/"):
            if mark in file:
                file = file.split(mark, 1)[1]
        return f"{self.function} at {file}:{self.line}"


class StackError(Exception):
    """py-spy could not read the stack: `kind` is denied, gone, timeout, missing or error."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(detail)


def py_spy_path() -> str | None:
    """py-spy on PATH, else beside this Python (a venv's bin/ not on PATH)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None


def _run(args: list[str], timeout_s: float) -> str:
    exe = py_spy_path()
    if exe is None:
        raise StackError("missing", "py-spy is not installed (pip install py-spy)")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise StackError("timeout", f"py-spy gave no stack within {timeout_s:g} s") from None
    except OSError as exc:
        raise StackError("error", f"cannot run py-spy: {exc}") from None
    if done.returncode != 0:
        raise _error(done.stdout + done.stderr)
    return done.stdout


def _error(output: str) -> StackError:
    """py-spy's failure text, as a kind: it prints "Permission Denied" when ptrace is
    refused and "Failed to get process executable name ... (os error 13)" when even
    /proc/PID/exe is closed to us."""
    text = output.strip()
    first = next((line for line in text.splitlines() if line.strip()), "py-spy failed")
    if "Permission Denied" in text or "os error 13" in text or "os error 1)" in text:
        return StackError("denied", "no permission to read the process's stack: needs "
                          + PTRACE_CAPABILITY)
    if "os error 2" in text or "os error 3)" in text or "No such process" in text:
        return StackError("gone", "the process exited")
    return StackError("error", first[:300])


Samples = Counter[tuple[int, tuple[Frame, ...]]]  # (thread id, stack innermost first)


def record(pid: int, duration_s: float, rate_hz: int = RECORD_RATE_HZ) -> Samples:
    """How often each thread's stack was seen over `duration_s`, idle threads included:
    a rank waiting in a collective is idle, and that is what matters here."""
    seconds = max(1, round(duration_s))  # py-spy takes whole seconds
    with tempfile.TemporaryDirectory(prefix="gpucheck-hang-") as tmp:
        out = os.path.join(tmp, "raw.txt")
        _run(["record", "--nonblocking", "--idle", "--threads", "--full-filenames",
              "--format", "raw", "--rate", str(rate_hz), "--duration", str(seconds),
              "--output", out, "--pid", str(pid)], seconds + RECORD_GRACE_S)
        text = _read_bounded(out)
    return parse_raw(text)


def _read_bounded(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as handle:
        data = handle.read(MAX_RAW_BYTES)
    # A cut file loses its last, partial line only (parse_raw skips it).
    return data.decode("utf-8", errors="replace")


def parse_raw(text: str) -> Samples:
    """py-spy's raw (collapsed) format with --threads, one line per distinct stack:
    `thread (TID): NAME;outer (file:line);...;inner (file:line) COUNT`. A thread with no
    name (started without the threading module, `python -c`, py-spy 0.4) has no
    `: NAME` part: `thread (TID);<module> (<string>:1) 49`."""
    stacks: Samples = Counter()
    for line in text.splitlines():
        match = _RAW_LINE.fullmatch(line.rstrip())
        if match is None:
            continue
        tid = int(match["tid"], 0)
        frames = [_raw_frame(part) for part in (match["frames"] or "").split(";")]
        stacks[(tid, tuple(f for f in reversed(frames) if f is not None))] += int(
            match["count"])
    return stacks


# The thread's name is the target's own text: it may hold anything but a newline
# (`;` in it would only add a frame that does not parse, and is dropped).
_RAW_LINE = re.compile(r"thread \((?P<tid>0x[0-9a-fA-F]{1,16}|\d{1,19})\)(?:: [^;]*)?"
                       r"(?:;(?P<frames>.*))? (?P<count>\d{1,9})")


def _raw_frame(part: str) -> Frame | None:
    name, _, rest = part.rpartition(" (")
    file, _, line = rest.rstrip(")").rpartition(":")
    if not name or not line.isdigit():
        return None
    return Frame(name, file, int(line))


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
