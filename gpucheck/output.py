"""Writing reports: atomically, so a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpucheck.errors import UsageError


def check_writable(path: str) -> None:
    """Fail early (before any work) when `path` cannot be written."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--output {path} is a directory: give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"--output {path}: {parent} is not a directory; choose another path")
    if not parent.is_dir():
        raise UsageError(f"--output {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output {path}: directory {parent} is not writable; choose another")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"--output {path} is not writable; choose another file")


def write_atomic(path: str, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename it into place."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise UsageError(f"cannot write --output {path}: {exc.strerror}; choose another") from exc
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600 files
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write --output {path}: {exc.strerror}; choose another") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
