"""Writing reports: atomically, only to regular files, keeping what was there.

Every report and baseline file goes through `write_atomic`. gpucheck runs as root
on cluster nodes, so a careless or hostile `-o` must not turn into damage:
`os.replace` onto `/dev/null`, a FIFO or a symlink to `/proc/self/fd/1` would swap
the device or pipe for a regular file. Only regular files (or a new name) are
written; a symlink to a regular file is written through, at its target. An
existing file keeps its mode (a 0600 report stays 0600) and, as root, its owner.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from gpucheck.errors import UsageError


class WriteError(UsageError):
    """The file could not be written (a full disk, a vanished directory): exit 2.
    The CLI still shows the report on stdout, so a long run's results are not lost."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def regular_target(path: str, option: str = "--output") -> Path:
    """The file `path` names, to be written: itself, or a symlink's regular target.
    UsageError for a directory, a device, a FIFO, a socket or a dangling symlink."""
    try:
        info = os.stat(path)  # follows symlinks: what would really be written
    except FileNotFoundError:
        if os.path.islink(path):
            raise UsageError(f"{option} {path} is a symlink to a missing file; give a "
                             "plain file name") from None
        return Path(path)
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}; choose another file") from None
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{option} {path} is a directory: give a file name")
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{option} {path} is {_kind(info.st_mode)}: gpucheck writes reports "
                         "only to regular files; give a file name")
    return Path(os.path.realpath(path))


def check_writable(path: str, option: str = "--output") -> None:
    """Fail early (before any work) when `path` cannot be written."""
    target = regular_target(path, option)
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a directory; choose another path")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: directory {parent} is not writable; choose another")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{option} {path} is not writable; choose another file")


def same_file(a: str | None, b: str | None) -> bool:
    """True when both paths name one file (through symlinks and `./`)."""
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def write_atomic(path: str, text: str, option: str = "--output") -> None:
    """Write `text` to a temp file beside the target, then rename it into place.

    The target is checked again here (it may have changed since check_writable);
    WriteError when the write fails, the target left as it was."""
    target = regular_target(path, option)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise WriteError(f"cannot write {option} {path}: {exc.strerror}") from None
    try:
        _copy_mode(fd, target)
        # backslashreplace: a lone surrogate in a value must not lose the whole report.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WriteError(f"cannot write {option} {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _copy_mode(fd: int, target: Path) -> None:
    """The existing file's mode (and owner, when root may set it); else the umask's
    default for a new file (mkstemp makes 0600 files)."""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        os.fchmod(fd, 0o666 & ~_current_umask())
        return
    os.fchmod(fd, stat.S_IMODE(info.st_mode))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        with contextlib.suppress(OSError):  # a filesystem without owners: mode still holds
            os.fchown(fd, info.st_uid, info.st_gid)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
