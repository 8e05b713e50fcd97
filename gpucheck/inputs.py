"""Reading files given on the command line (reports, baselines, kernel logs): regular
files only (opened O_NONBLOCK, checked by fstat), read and inflated up to a cap; errors
are `InputError` in words a person can act on (README, "Trust boundaries").
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

MIB = 1024**2
# A report of 8 GPUs' stress with every table is well under 1 MiB; 32 MiB leaves room
# for a thousand ranks and stops a wrong file (a disk image, a core dump) early.
REPORT_MAX_BYTES = 32 * MIB
# Kernel log lines are short (printk's limit is 1024 bytes); longer pieces are split.
MAX_LINE_BYTES = 64 * 1024


class InputError(OSError):
    """A file that is not read: `strerror` says why (not a regular file, too big)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str, follow: bool = True) -> BinaryIO:
    """`path` open for reading in binary once `fstat` says it is a regular file (a FIFO
    never blocks: O_NONBLOCK); `follow=False` refuses a symlink too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # as open() says it
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise InputError(errno.EINVAL, f"is {_kind(mode)}, not a regular file")
        # Left non-blocking: a disk file ignores it, and a pseudo-file that would wait
        # for data (/proc/kmsg is "regular") answers "no more" instead of hanging.
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str, limit: int = REPORT_MAX_BYTES, follow: bool = True) -> bytes:
    """The whole regular file at `path`; InputError when it holds more than `limit` bytes."""
    with open_regular(path, follow) as handle:
        data = handle.read(limit + 1) or b""  # None: a pseudo-file with nothing to read
    if len(data) > limit:
        raise InputError(errno.EFBIG, f"is larger than {limit / MIB:g} MiB, too big for a "
                                      "gpucheck report (is it the right file?)")
    return data


class LineReader(Protocol):
    """What bounded_lines reads: a binary file, or a GzipFile (not a BinaryIO)."""

    def readline(self, size: int = -1, /) -> bytes: ...


def bounded_lines(handle: LineReader, limit: int, max_line: int = MAX_LINE_BYTES,
                  what: str = "") -> Iterator[bytes]:
    """The lines of `handle`, none longer than `max_line` (a longer one comes in
    pieces); InputError once more than `limit` bytes were read."""
    total = 0
    while True:
        line = handle.readline(max_line)
        if not line:
            return
        total += len(line)
        if total > limit:
            raise InputError(errno.EFBIG, f"{what or 'holds'} more than {limit / MIB:g} MiB; "
                                          "not read")
        yield line


def gzip_lines(handle: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of the gzip stream in `handle`, inflated up to `limit` bytes (a gzip
    bomb stops there); a damaged stream is an InputError, as a truncated one is."""
    import gzip  # only for a .gz log: zlib and gzip cost every run otherwise
    import zlib

    try:
        with gzip.GzipFile(fileobj=handle, mode="rb") as unzipped:
            yield from bounded_lines(unzipped, limit, what="decompresses to")
    except (zlib.error, EOFError) as exc:
        raise InputError(errno.EINVAL, f"is a damaged gzip file ({exc})") from None


class JsonProblem(ValueError):
    """Valid JSON that no gpucheck wrote: a number of hundreds of digits, a lone
    surrogate. The message says which, in words for the one-line error."""


# 2**64 has 20 digits: no count, byte total or id gpucheck writes is longer. A longer
# one is an attack on int() (Python refuses over 4300 digits) or float() (overflow).
MAX_INT_DIGITS = 20


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonProblem(f"holds a number of {digits} digits (no gpucheck report does)")
    return int(text)


def parse_json(data: bytes) -> Any:
    """JSON from `data`, every integer short and every string valid Unicode.

    json.loads accepts "\\ud800" (a lone surrogate): it cannot be written as UTF-8, so
    printing or saving it would fail far from here. JsonProblem for either; the
    json module's own errors (JSONDecodeError, UnicodeDecodeError, RecursionError)
    pass through."""
    # Both checks cost a call per value: made only where the bytes could hold what they
    # look for (a run of 21 digits; a \\u escape of a surrogate, D800-DFFF). UTF-16 or
    # -32 (NULs in the first bytes, as json detects them) is always checked.
    wide = b"\x00" in data[:4]
    long_digits = wide or b"0" * (MAX_INT_DIGITS + 1) in data.translate(_DIGITS_AS_0)
    value = json.loads(data, parse_int=_parse_int) if long_digits else json.loads(data)
    if wide or _SURROGATE_ESCAPE.search(data):
        _check_strings(value)
    return value


_DIGITS_AS_0 = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # "0" or " "
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_strings(value: Any) -> None:
    """No lone surrogate in any key or string (iterative: depth is json's problem)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise JsonProblem("holds a lone surrogate (\\ud800-\\udfff), not valid "
                                  "Unicode text") from None
