"""Xid errors in this boot's kernel log (`sudo dmesg | grep -iE 'xid|fallen off'`).

Sources, first readable wins: `dmesg`, then `journalctl -k -b` (the kernel's own
transport). /var/log/kern.log and /var/log/messages are never read unasked: any user
writes a line there that no reader can tell from the kernel's (`logger -t kernel
"NVRM: Xid ..."` gives "<time> <host> kernel: NVRM: Xid ..."), so a forged Xid would
drain the node and a forged boot banner would hide real ones. `--kernel-log FILE`
reads a saved log instead (a dmesg attached to a ticket, a kern.log the operator
vouches for; .gz too). Only NVRM lines are parsed, and
only their parsed fields are kept: the kernel log can hold secrets, so no other
line ever reaches the report. Each (GPU, XID) becomes one row and, unless the
table calls it information, one finding, judged by `xid_table.judge_xid` on the
line's own words (see gpucheck/probes/xid_table.py and docs/xid.md).

Reading happens in phase 1 (`read_kernel_log`, never raises for a missing or
forbidden source); naming the GPUs needs NVML, so the section is built later
(`gpucheck.probes.xid_section.kernel_log_section`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from gpucheck.devices import normal_bus_id
from gpucheck.errors import UsageError
from gpucheck.inputs import MAX_LINE_BYTES, bounded_lines, gzip_lines, open_regular

TITLE = "Kernel log: Xid errors"
DMESG_TIMEOUT_S = 5.0
JOURNAL_TIMEOUT_S = 10.0
# Not read unless given with --kernel-log (see the module doc): any user writes there.
UNTRUSTED_FILES = "/var/log/kern.log, /var/log/messages: not read, any user can write a " \
    "'kernel:' line there (logger -t kernel); pass one with --kernel-log to trust it"
MAX_READ_BYTES = 256 * 1024**2  # a years-old kern.log: read only its tail
SAMPLE_CHARS = 120

_PCI = r"(?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
# Every pattern below is matched at the start of the message, after the prefix the
# log's own format puts there (`_PREFIX`), never anywhere in a line: any user can put
# text into the kernel log (a failed `mount -o "<text>"` logs
# "tmpfs: Unknown parameter '<text>'"), and a forged "NVRM: Xid" inside such a line
# must not drain a node. Only the driver writes a message that starts with "NVRM:".
# "NVRM: Xid (PCI:0000:3b:00): 79, ..."; on a MIG GPU the driver adds the instances:
# "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 94, ..." (open-gpu-kernel-modules,
# krcReportXid: "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u").
_XID_RE = re.compile(rf"NVRM: Xid \({_PCI}(?P<mig>(?:\s+GPU-C?I:\s*\d+)*)\s*\):\s*"
                     r"(?P<xid>\d+)\b,?\s*(?P<detail>.*)")
# "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." (and the older
# "NVRM: GPU at 0000:01:00.0 has fallen off the bus.")
_OFF_BUS_RE = re.compile(rf"NVRM: GPU (?:at )?{_PCI}:? (?:GPU )?has fallen off the bus")
_UUID_RE = re.compile(rf"NVRM: GPU at {_PCI}: (?P<uuid>GPU-[0-9A-Fa-f-]{{8,}})")
# A GPU lost with no Xid line at all, on one line or wrapped over several NVRM: lines:
#   NVRM: The NVIDIA GPU 0000:b3:00.0
#                  NVRM: (PCI ID: 10de:26b5) installed in this system has
#                  NVRM: fallen off the bus and is not responding to commands.
_LOST_RE = re.compile(rf"NVRM: The NVIDIA GPU {_PCI}")
_NVRM_TEXT = re.compile(r"NVRM:\s*(.*)")
LOST_MESSAGE_LINES = 4  # NVRM: lines to read for "fallen off the bus" after its start
_ISO = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
_SYSLOG = r"[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}"
_CTIME = r"[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}"
# What the accepted formats put before the kernel's message, each part optional:
# a /dev/kmsg or `dmesg -r` level "<3>"; `dmesg -x` "kern  :err   : "; a journalctl
# `-o short-iso`/`dmesg --time-format iso` or syslog/journalctl `short` stamp, then for
# syslog and journalctl the host and "kernel:" (only after such a stamp: dmesg never
# writes one, and a kernel message that begins with a user's words, a task's name,
# must not pass for a prefix); then dmesg's "[ 1283.204] " or
# `dmesg -T`'s "[Thu Nov 26 10:00:00 2026] ". Leading blanks: a wrapped message.
_PREFIX = re.compile(
    r"\s*(?:<\d{1,3}>)?(?:[a-z]+\s*:[a-z]+\s*: )?"
    rf"(?:(?:(?P<iso>{_ISO})|(?P<syslog>{_SYSLOG}))\s+(?:\S+ kernel:\s*)?)?"
    rf"(?:\[(?P<ctime>{_CTIME})\]\s*|\[\s*(?P<mono>\d+\.\d+)\]\s*)?")


def message(line: str) -> tuple[str | None, str]:
    """(the line's time, the kernel's message): what follows the prefix `_PREFIX`
    accepts. Patterns match the message at its start, never inside another message."""
    match = _PREFIX.match(line)
    if match is None:  # the pattern is all optional: never, but keep the types honest
        return None, line
    stamp = match["iso"] or match["syslog"] or match["ctime"]  # the wall clock first
    if stamp is None and match["mono"] is not None:
        stamp = f"{match['mono']} s after boot"
    return stamp, line[match.end():]


@dataclass(frozen=True)
class XidEvent:
    """One NVRM line: which GPU, which XID, when, and the driver's words (truncated)."""

    bus_id: str  # normal form, "0000:3B:00.0"
    pci_id: str  # as the log wrote it, "0000:3b:00"
    xid: int
    time: str | None
    detail: str
    off_bus_line: bool = False  # a "fallen off the bus" line, not an Xid line
    instance: str | None = None  # on a MIG GPU, "GPU-I:05 GPU-CI:02"

    @property
    def sample(self) -> str:
        return _truncate(f"[{self.instance}] {self.detail}" if self.instance else self.detail)


@dataclass(frozen=True)
class KernelLog:
    """What was read: the source (None when none was readable) and the NVRM events."""

    source: str | None
    lines_scanned: int = 0
    events: tuple[XidEvent, ...] = ()
    uuids_by_bus: dict[str, str] = field(default_factory=dict)  # from "GPU at PCI:" lines
    not_read: tuple[str, ...] = ()  # why each source tried before (or instead) failed
    note: str | None = None


@dataclass
class _Lost:
    """A "The NVIDIA GPU <bus id>" message still being read (it may wrap)."""

    pci: str
    time: str | None
    text: list[str]


@dataclass
class _Scan:
    lines: int = 0
    events: list[XidEvent] = field(default_factory=list)
    uuids: dict[str, str] = field(default_factory=dict)
    lost: _Lost | None = None


def _bus_id(pci: str) -> str:
    full = pci if "." in pci else f"{pci}.0"
    return normal_bus_id(full) or full


def _truncate(text: str) -> str:
    text = text.strip()
    return text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS - 1] + "…"


def parse_line(line: str) -> XidEvent | tuple[str, str] | None:
    """An Xid or fallen-off-the-bus event, a (bus id, UUID) pair, or None for other lines."""
    if "NVRM:" not in line:
        return None
    stamp, text = message(line)
    match = _XID_RE.match(text)
    if match:
        instance = " ".join(match["mig"].split()) or None
        return XidEvent(_bus_id(match["pci"]), match["pci"], int(match["xid"]), stamp,
                        match["detail"].strip()[:SAMPLE_CHARS * 4], instance=instance)
    match = _OFF_BUS_RE.match(text)
    if match:
        return XidEvent(_bus_id(match["pci"]), match["pci"], 79, stamp,
                        "GPU has fallen off the bus.", off_bus_line=True)
    match = _UUID_RE.match(text)
    if match:
        return _bus_id(match["pci"]), match["uuid"]
    return None


def _follow_lost(scan: _Scan, line: str, parsed: bool) -> None:
    """Read the driver's no-Xid "has fallen off the bus" message, wrapped or not: from its
    "The NVIDIA GPU <bus id>" start, over at most LOST_MESSAGE_LINES NVRM: lines. A line
    parsed as something else (an Xid line, another GPU's) ends it: its words are not
    this message's."""
    if parsed:
        scan.lost = None
    if "NVRM:" not in line or parsed:
        return
    stamp, said_here = message(line)
    start = _LOST_RE.match(said_here)
    if start is not None:
        scan.lost = _Lost(start["pci"], stamp, [])
    text = _NVRM_TEXT.match(said_here)
    if scan.lost is None or text is None:
        return
    scan.lost.text.append(text[1].strip())
    said = " ".join(scan.lost.text)
    if "fallen off the bus" in said:
        lost = scan.lost
        scan.events.append(XidEvent(_bus_id(lost.pci), lost.pci, 79, lost.time, said,
                                    off_bus_line=True))
        scan.lost = None
    elif len(scan.lost.text) >= LOST_MESSAGE_LINES:  # another message ("not supported")
        scan.lost = None


def scan_lines(lines: Iterable[str]) -> _Scan:
    """Parse every line."""
    scan = _Scan()
    for line in lines:
        scan.lines += 1
        parsed = parse_line(line)
        if isinstance(parsed, XidEvent):
            scan.events.append(parsed)
        elif parsed is not None:
            scan.uuids[parsed[0]] = parsed[1]
        _follow_lost(scan, line, parsed is not None)
    return scan


def _is_gzip(path: str) -> bool:
    with open_regular(path) as raw:
        return raw.read(2) == b"\x1f\x8b"


def _file_lines(path: str) -> Iterator[str]:
    """The lines of a text or gzip file; of a huge text one, only the last MAX_READ_BYTES.
    Regular files only, lines and gzip inflation bounded (gpucheck/inputs.py): a FIFO,
    /dev/zero or a gzip bomb is refused, not read forever."""
    if _is_gzip(path):  # nvidia-bug-report.log.gz, a compressed kern.log.1.gz
        with open_regular(path) as raw:
            for chunk in gzip_lines(raw, MAX_READ_BYTES):
                yield chunk.decode("utf-8", errors="replace")
        return
    with open_regular(path) as raw:
        size = os.fstat(raw.fileno()).st_size
        raw.seek(max(0, size - MAX_READ_BYTES))
        if size > MAX_READ_BYTES:
            raw.readline(MAX_LINE_BYTES)  # a partial first line
        for chunk in bounded_lines(raw, MAX_READ_BYTES + MAX_LINE_BYTES):
            yield chunk.decode("utf-8", errors="replace")


def _from_scan(source: str, scan: _Scan, not_read: Sequence[str] = (),
               note: str | None = None) -> KernelLog:
    return KernelLog(source, scan.lines, tuple(scan.events), dict(scan.uuids),
                     tuple(not_read), note)


def read_file(path: str, source: str | None = None) -> KernelLog:
    """A saved or on-disk kernel log; unreadable -> source None with the reason."""
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
    """Run a log command in the C locale (stable messages), never waiting past `timeout_s`."""
    return subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, "LC_ALL": "C"})


def _command_output(runner: Runner, argv: Sequence[str],
                    timeout_s: float) -> tuple[str | None, str | None]:
    """(stdout, None) when the command gave kernel lines, else (None, why not)."""
    name = " ".join(argv[:3]) if argv[0] == "journalctl" else argv[0]
    try:
        done = runner(argv, timeout_s)
    except FileNotFoundError:
        return None, f"{name}: not installed"
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
    if not any(line.strip() and not line.startswith("-- ") for line in done.stdout.splitlines()):
        return None, f"{name}: {said or 'printed no kernel lines this user can read'}"
    return done.stdout, None


def read_live_log(runner: Runner = run_command) -> KernelLog:
    """This boot's kernel log from the first readable source, with why the others were not."""
    not_read: list[str] = []
    commands = ((["dmesg"], DMESG_TIMEOUT_S),
                (["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso"], JOURNAL_TIMEOUT_S))
    for argv, timeout_s in commands:
        text, reason = _command_output(runner, argv, timeout_s)
        if text is not None:
            source = "journalctl -k -b" if argv[0] == "journalctl" else "dmesg"
            return _from_scan(source, scan_lines(text.splitlines()), not_read)
        not_read.append(reason or argv[0])
    return KernelLog(None, not_read=(*not_read, UNTRUSTED_FILES))


def read_kernel_log(path: str | None = None, runner: Runner = run_command) -> KernelLog:
    """Phase 1: the saved log at `path` (`--kernel-log`), else this boot's live log."""
    return read_file(path) if path is not None else read_live_log(runner)


def checked_kernel_log_path(path: str | None) -> str | None:
    """`--kernel-log FILE`, once known readable; a UsageError (exit 2) when it is not."""
    if path is None:
        return None
    try:
        with open_regular(path) as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"--kernel-log {path}: cannot read it "
                         f"({exc.strerror or type(exc).__name__})") from None
    return path

