"""Writing files: atomically, never through a link, never where another user can reach
(as root); a device or an open descriptor (`-o /dev/stdout`) as a stream. Every file
gpucheck writes goes through `write_atomic` (README, "Trust boundaries").
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable

from gpucheck.errors import UsageError

# Names of a descriptor this process already has open: written to it as a stream.
_OPEN_FD = re.compile(r"/(?:dev/(?:std(out|err)|fd/(\d+))|proc/self/fd/(\d+))")


class WriteError(UsageError):
    """The file could not be written (a full disk): exit 2, the report still shown."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def open_fd(path: str) -> int | None:
    """The descriptor `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` or `/proc/self/fd/N`
    names, else None."""
    match = _OPEN_FD.fullmatch(path)
    if match is None:
        return None
    std, dev_fd, proc_fd = match.groups()
    return {"out": 1, "err": 2}[std] if std else int(dev_fd or proc_fd)


def others_may_write(info: os.stat_result) -> str | None:
    """Why another user could change what is in this folder, or None: it is theirs, or
    its group (not root's) or everyone may write it and it is not sticky."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {info.st_uid}"
    if mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and info.st_gid != 0):
        return f"may be written by other users (mode {mode:o}, not sticky)"
    return None


def _unsafe_folder(dfd: int, folder: str) -> str | None:
    """As root: why `folder` (open as `dfd`) or one above it is not safe to write in,
    on the path as given and the real path, matched against the descriptor; or None."""
    if os.geteuid() != 0:
        return None
    real = os.path.realpath(folder)
    opened, named = os.fstat(dfd), os.stat(real)
    if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
        return "changed while it was checked"
    return unsafe_chain(os.path.abspath(folder)) or unsafe_chain(real)


def unsafe_chain(path: str) -> str | None:
    """The first of `path` and the folders above it that another user could change
    (those not made yet are skipped)."""
    while True:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        why = None if info is None else (
            (f"is a link made by uid {info.st_uid}" if info.st_uid not in (0, os.geteuid())
             else None) if stat.S_ISLNK(info.st_mode) else others_may_write(info))
        if why is not None:
            return f"{path} {why}"
        if path == os.path.dirname(path):
            return None
        path = os.path.dirname(path)


def _open_folder(path: str, option: str) -> tuple[int, str]:
    """(descriptor of the folder `path` is in, the last component), or UsageError."""
    if not path:
        raise UsageError(f"{option} is empty: give a file name")
    folder, name = os.path.split(path)
    folder = folder or "."
    if not name:
        raise UsageError(f"{option} {path} is a directory: give a file name")
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: directory {folder} does not exist; create it "
                         "first") from None
    except NotADirectoryError:
        raise UsageError(f"{option} {path}: {folder} is not a directory; choose another "
                         "path") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {folder}: {exc.strerror}; choose another "
                         "path") from None
    why = _unsafe_folder(dfd, folder)
    if why is not None:
        os.close(dfd)
        raise UsageError(f"{option} {path}: {why}: root does not write where another user "
                         "can plant a link; write to a folder only root may change")
    return dfd, name


def _existing(dfd: int, name: str, path: str, option: str) -> os.stat_result | None:
    """What is at the name (never followed): None, or UsageError unless a file or a
    character device."""
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}; choose another file") from None
    if stat.S_ISLNK(info.st_mode):
        raise UsageError(f"{option} {path} is a symlink: gpucheck never writes through a "
                         "link (another user could aim it at any file); give the file's "
                         "own path")
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{option} {path} is a directory: give a file name")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode)):
        raise UsageError(f"{option} {path} is {_kind(info.st_mode)}: gpucheck writes only "
                         "regular files and streams; give a file name")
    return info


def check_writable(path: str, option: str = "--output") -> None:
    """Fail early (before any work) when `path` cannot or must not be written."""
    fd = open_fd(path)
    if fd is not None:
        _check_open_fd(fd, path, option)
        return
    dfd, name = _open_folder(path, option)
    try:
        info = _existing(dfd, name, path, option)
        if not os.access(os.path.dirname(path) or ".", os.W_OK | os.X_OK):
            raise UsageError(f"{option} {path}: directory {os.path.dirname(path) or '.'} is "
                             "not writable; choose another")
        if info is not None and not os.access(name, os.W_OK, dir_fd=dfd):
            raise UsageError(f"{option} {path} is not writable; choose another file")
    finally:
        os.close(dfd)


def discard(path: str, option: str) -> None:
    """Remove the regular file at `path` if any, under the rules of writing it."""
    if open_fd(path) is not None:
        return
    dfd, name = _open_folder(path, option)
    try:
        info = _existing(dfd, name, path, option)
        if info is not None and stat.S_ISREG(info.st_mode):
            _guarded(path, option, lambda: os.unlink(name, dir_fd=dfd))
    finally:
        os.close(dfd)


def _check_open_fd(fd: int, path: str, option: str) -> None:
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"{option} {path}: descriptor {fd} is not open; give a file "
                         "name") from None


def same_file(a: str | None, b: str | None) -> bool:
    """True when both paths name one file (through symlinks and `./`)."""
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def check_folder(path: str, option: str) -> None:
    """UsageError when a file at `path` could not be written (its folder's rules)."""
    os.close(_open_folder(path, option)[0])


def write_atomic(path: str, text: str | bytes, option: str = "--output",
                 sync: bool = True) -> None:
    """Write `text` at `path` (a temp file renamed over it; a device or a descriptor as
    a stream), checked again here; WriteError leaves the target as it was. `sync=False`:
    no fsync, for files that matter only while the run lasts."""
    # backslashreplace: a lone surrogate in a value must not lose the whole report.
    data = text if isinstance(text, bytes) else text.encode("utf-8", errors="backslashreplace")
    fd = open_fd(path)
    if fd is not None:
        _check_open_fd(fd, path, option)
        _guarded(path, option, lambda: _write_all(fd, data))
        return
    dfd, name = _open_folder(path, option)
    try:
        info = _existing(dfd, name, path, option)
        if info is not None and stat.S_ISCHR(info.st_mode):
            _guarded(path, option, lambda: _write_device(dfd, name, data))
        else:
            _guarded(path, option, lambda: _replace(dfd, name, data, info, sync))
    finally:
        os.close(dfd)


def _guarded(path: str, option: str, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as exc:
        raise WriteError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_device(dfd: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=dfd)
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):  # swapped since it was looked at
            raise OSError(0, "it changed while being written; try again")
        _write_all(fd, data)
    finally:
        os.close(fd)


def _replace(dfd: int, name: str, data: bytes, info: os.stat_result | None,
             sync: bool) -> None:
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    try:
        try:
            _copy_mode(fd, info)
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def _copy_mode(fd: int, info: os.stat_result | None) -> None:
    """The existing file's mode (and owner, as root); else the umask's default."""
    if info is None:
        os.fchmod(fd, 0o666 & ~_current_umask())
        return
    os.fchmod(fd, stat.S_IMODE(info.st_mode))
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):  # a filesystem without owners: mode still holds
            os.fchown(fd, info.st_uid, info.st_gid)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
