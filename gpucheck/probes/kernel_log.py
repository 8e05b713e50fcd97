"""Xid errors in this boot's kernel log (`sudo dmesg | grep -iE 'xid|fallen off'`): phase 1
of env, reading only (`read_kernel_log`, never raises). Sources, first readable wins:
/dev/kmsg, `journalctl -k -b -o json`, `dmesg`; kern.log only when given (--kernel-log).
Only the kernel's records reach `xid_section`, which keeps only NVRM fields (docs/xid.md)."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from gpucheck.errors import UsageError
from gpucheck.inputs import MAX_LINE_BYTES, bounded_lines, gzip_lines, open_regular
from gpucheck.probes.xid_section import (
    KernelLog,
    Record,
    Scan,
    scan_records,
)

DMESG_TIMEOUT_S = 5.0
KMSG_SOURCE = "/dev/kmsg"  # the live source's name, as a runner is asked for it
KMSG = KMSG_SOURCE  # the file it reads (a test points it elsewhere)
KMSG_TIMEOUT_S = 5.0
KMSG_READ_BYTES = 16384  # more than a record holds (the kernel refuses a smaller read)
JOURNAL_TIMEOUT_S = 10.0
UNTRUSTED_FILES = "/var/log/kern.log, /var/log/messages: not read, any user can write a " \
    "'kernel:' line there (logger -t kernel); pass one with --kernel-log to trust it"
MAX_READ_BYTES = 256 * 1024**2  # a years-old kern.log: read only its tail
_ISO = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
_SYSLOG = r"[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}"
_CTIME = r"[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}"
_TAG = r"(?:[^\s:]+ )?kernel: ?"  # "[host ]kernel:": journalctl and syslog's tag
# A record's source by the forms each tool writes before the message: "<pri>", `dmesg
# -x`'s "kern  :err   : ", an ISO or syslog stamp then "[host ]kernel:" (a syslog stamp
# needs the tag: any program logs with a stamp), "[ 1283.204] " or `dmesg -T`'s stamp.
# Spaces only separate: \v, \f and \r are text, never a record's edge.
_START = re.compile(
    r"(?:<(?P<pri>\d{1,4})>)?(?:(?P<facility>[a-z]+) *:[a-z]+ *: )?"
    rf"(?:(?P<iso>{_ISO}) (?:{_TAG})?|(?P<syslog>{_SYSLOG}) {_TAG}|(?P<tag>kernel: ?))?"
    rf"(?:\[(?P<ctime>{_CTIME})\] ?|\[ *(?P<mono>\d+\.\d+)\] ?)?")
# /dev/kmsg: "pri,seq,usec,flags[,...];message", control characters escaped as \xNN.
_KMSG = re.compile(r"(?P<pri>\d{1,4}),\d+,(?P<usec>\d+),[^;]*;(?P<text>.*)")
_ESCAPED = re.compile(r"\\x([0-9a-fA-F]{2})")
RECORD_LINES = 8  # a record's lines kept: the driver's longest message has 4
KERNEL_FACILITY = 0  # LOG_KERN: what userspace can never claim (it gets LOG_USER)


def _after_boot(seconds: str) -> str:
    return f"{seconds} s after boot"


def _usec_after_boot(usec: int) -> str:
    """"1283.204000 s after boot", as dmesg shows it: one fingerprint whatever the source."""
    return _after_boot(f"{usec // 10**6}.{usec % 10**6:06d}")


def start_record(line: str) -> Record | None:
    """The record a line starts; None when its source is not the kernel, or not known."""
    kmsg = _KMSG.fullmatch(line)
    if kmsg is not None:  # /dev/kmsg: only facility 0 is the kernel's
        if int(kmsg["pri"]) >> 3 != KERNEL_FACILITY:
            return None
        text = _ESCAPED.sub(lambda m: chr(int(m[1], 16)), kmsg["text"])
        return Record(_usec_after_boot(int(kmsg["usec"])),
                      tuple(text.split("\n")[:RECORD_LINES]))
    match = _START.match(line)
    if match is None or match.end() == 0:  # no source form: nothing says it is the kernel's
        return None
    if match["pri"] is not None and int(match["pri"]) >> 3 != KERNEL_FACILITY:
        return None
    if match["facility"] not in (None, "kern"):
        return None
    stamp = match["iso"] or match["syslog"] or match["ctime"]  # the wall clock first
    if stamp is None and match["mono"] is not None:
        stamp = _after_boot(match["mono"])
    return Record(stamp, (line[match.end():],))


def text_records(lines: Iterable[str]) -> Iterator[Record]:
    """The kernel's records in lines split on "\\n" (never `str.splitlines`): an indented
    line continues the record before it, an empty line ends it; other sources' records
    are left out whole."""
    current: Record | None = None
    for line in lines:
        line = line[:-1] if line.endswith("\n") else line
        line = line[:-1] if line.endswith("\r") else line  # a saved log with CRLF ends
        if line[:1] in (" ", "\t"):
            if current is not None and len(current.lines) < RECORD_LINES:
                current = Record(current.time, (*current.lines, line.strip(" \t")))
            continue
        if current is not None:
            yield current
        current = start_record(line) if line else None
    if current is not None:
        yield current


def journal_records(lines: Iterable[str]) -> Iterator[Record]:
    """`journalctl -k -o json`: only the kernel's entries (`_TRANSPORT` kernel, which
    only journald sets), each with its whole MESSAGE."""
    import json

    for line in lines:
        try:
            entry = json.loads(line) if len(line) <= MAX_LINE_BYTES else None
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("_TRANSPORT") != "kernel" or \
                entry.get("SYSLOG_FACILITY", "0") != "0":
            continue
        text = _journal_text(entry.get("MESSAGE"))
        usec = str(entry.get("_SOURCE_MONOTONIC_TIMESTAMP", ""))
        stamp = _usec_after_boot(int(usec)) if usec.isdigit() and len(usec) < 20 else None
        if text:
            yield Record(stamp, tuple(text.split("\n")[:RECORD_LINES]))


def _journal_text(message: object) -> str | None:
    """MESSAGE as text: a string, or (not UTF-8) the list of its bytes."""
    if isinstance(message, str):
        return message
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        return bytes(message).decode("utf-8", errors="replace")
    return None


def _counted(scan: Scan, lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        scan.lines += 1
        yield line


def scan_lines(lines: Iterable[str]) -> Scan:
    scan = Scan()
    return scan_records(text_records(_counted(scan, lines)), scan)


def _is_gzip(path: str) -> bool:
    with open_regular(path) as raw:
        return raw.read(2) == b"\x1f\x8b"


def _file_lines(path: str) -> Iterator[str]:
    """A text or gzip file's lines (of a huge text file only the tail), regular files
    only, bounded (gpucheck/inputs.py)."""
    if _is_gzip(path):  # nvidia-bug-report.log.gz, a compressed kern.log.1.gz
        with open_regular(path) as raw:
            yield from _whole_lines(gzip_lines(raw, MAX_READ_BYTES))
        return
    with open_regular(path) as raw:
        size = os.fstat(raw.fileno()).st_size
        raw.seek(max(0, size - MAX_READ_BYTES))
        pieces = bounded_lines(raw, MAX_READ_BYTES + MAX_LINE_BYTES)
        if size > MAX_READ_BYTES:  # the first line is what is left of a line
            for piece in pieces:
                if piece.endswith(b"\n"):
                    break
        yield from _whole_lines(pieces)


def _whole_lines(pieces: Iterable[bytes]) -> Iterator[str]:
    """Lines cut at MAX_LINE_BYTES: the rest of a line never passes for a line's start."""
    rest = False
    for piece in pieces:
        if not rest:
            yield piece.decode("utf-8", errors="replace")
        rest = not piece.endswith(b"\n")


def _from_scan(source: str, scan: Scan, not_read: Sequence[str] = (),
               note: str | None = None) -> KernelLog:
    return KernelLog(source, scan.lines, tuple(scan.events), dict(scan.uuids),
                     tuple(not_read), note)


def read_file(path: str, source: str | None = None) -> KernelLog:
    name = source or path
    try:
        cut_short = os.stat(path).st_size > MAX_READ_BYTES and not _is_gzip(path)
        scan = scan_lines(_file_lines(path))
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return KernelLog(None, not_read=(f"{name}: {reason}",))
    note = f"read only its last {MAX_READ_BYTES / 1024**2:g} MiB" if cut_short else None
    return _from_scan(name, scan, note=note)


# ---- the live log of this boot ----

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """A log command in the C locale within `timeout_s`; `[KMSG]` reads /dev/kmsg."""
    if list(argv) == [KMSG_SOURCE]:
        return subprocess.CompletedProcess(list(argv), 0, read_kmsg(KMSG, timeout_s), "")
    return subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, "LC_ALL": "C"})


def read_kmsg(path: str, timeout_s: float) -> str:
    """Every record /dev/kmsg still holds, non-blocking (the end is EAGAIN), bounded;
    only the kernel's record device (char 1:11) or a regular file."""
    import time

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or (
                stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 11))):
            raise OSError(errno.EINVAL, "not the kernel's record device")
        chunks: list[bytes] = []
        end, total = time.monotonic() + timeout_s, 0
        while total < MAX_READ_BYTES and time.monotonic() < end:
            try:
                chunk = os.read(fd, KMSG_READ_BYTES)  # one record a read on the device
            except BlockingIOError:  # no record left
                break
            except BrokenPipeError:  # a record overwritten while reading: go on
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _command_output(runner: Runner, argv: Sequence[str],
                    timeout_s: float) -> tuple[str | None, str | None]:
    name = " ".join(argv[:3]) if argv[0] == "journalctl" else argv[0]
    try:
        done = runner(argv, timeout_s)
    except FileNotFoundError:
        return None, f"{name}: {'absent' if argv[0] == KMSG_SOURCE else 'not installed'}"
    except subprocess.TimeoutExpired:
        return None, f"{name}: no answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"{name}: {exc.strerror or exc}"
    said = next((line.strip() for line in (done.stderr or "").splitlines() if line.strip()), "")
    if done.returncode != 0:
        reason = said or f"exit status {done.returncode}"
        if "not permitted" in reason.lower() and argv[0] == "dmesg":
            reason += " (kernel.dmesg_restrict=1: only root may read it)"
        return None, f"{name}: {reason}"
    # journalctl marks its own notes with "-- ... --"; a user outside the
    # systemd-journal/adm groups gets only those.
    if not any(line.strip() and not line.startswith("-- ") for line in done.stdout.split("\n")):
        return None, f"{name}: {said or 'printed no kernel lines this user can read'}"
    return done.stdout, None


# The live sources, structured ones first (facility or transport, whole text).
_LIVE: tuple[tuple[str, tuple[str, ...], float, Callable[[Iterable[str]], Iterator[Record]]],
             ...] = (
    (KMSG_SOURCE, (KMSG_SOURCE,), KMSG_TIMEOUT_S, text_records),
    # only the fields read: a whole boot's kernel entries in full JSON run to 100s of MB
    ("journalctl -k -b", ("journalctl", "-k", "-b", "--no-pager", "-o", "json",
                          "--output-fields=MESSAGE,_TRANSPORT,SYSLOG_FACILITY,"
                          "_SOURCE_MONOTONIC_TIMESTAMP"), JOURNAL_TIMEOUT_S, journal_records),
    ("dmesg", ("dmesg",), DMESG_TIMEOUT_S, text_records),
)


def read_live_log(runner: Runner = run_command) -> KernelLog:
    not_read: list[str] = []
    for source, argv, timeout_s, records in _LIVE:
        text, reason = _command_output(runner, argv, timeout_s)
        if text is not None:
            scan = Scan()
            scan_records(records(_counted(scan, text.split("\n"))), scan)
            return _from_scan(source, scan, not_read)
        not_read.append(reason or argv[0])
    return KernelLog(None, not_read=(*not_read, UNTRUSTED_FILES))


def read_kernel_log(path: str | None = None, runner: Runner = run_command) -> KernelLog:
    """Phase 1: the saved log at `path` (`--kernel-log`), else this boot's live log."""
    return read_file(path) if path is not None else read_live_log(runner)


KERNEL_LOG_VAR = "GPUCHECK_KERNEL_LOG"


def checked_kernel_log_path(path: str | None,
                            environ: Mapping[str, str] | None = None) -> str | None:
    """`--kernel-log FILE`, else GPUCHECK_KERNEL_LOG from `environ`, checked readable
    (UsageError otherwise); None for this boot's live log."""
    given = f"--kernel-log {path}"
    if path is None and environ is not None and environ.get(KERNEL_LOG_VAR):
        path = environ[KERNEL_LOG_VAR]
        given = f"{KERNEL_LOG_VAR}={path}"
    if path is None:
        return None
    try:
        with open_regular(path) as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"{given}: cannot read it "
                         f"({exc.strerror or type(exc).__name__})") from None
    return path

