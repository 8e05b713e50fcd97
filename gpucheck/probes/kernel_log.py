"""Xid errors in this boot's kernel log (`sudo dmesg | grep -iE 'xid|fallen off'`).

Sources, first readable wins: `dmesg`, `journalctl -k -b`, then /var/log/kern.log
or /var/log/messages (cut at the last boot). `--kernel-log FILE` reads a saved log
instead (a dmesg attached to a ticket; .gz too). Only NVRM lines are parsed, and
only their parsed fields are kept: the kernel log can hold secrets, so no other
line ever reaches the report. Each (GPU, XID) becomes one row and, unless the
table calls it information, one finding, judged by `xid_table.judge_xid` on the
line's own words (see gpucheck/probes/xid_table.py and docs/xid.md).

Reading happens in phase 1 (`read_kernel_log`, never raises for a missing or
forbidden source); naming the GPUs needs NVML, so the section is built later
(`kernel_log_section`).
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from gpucheck.devices import normal_bus_id
from gpucheck.errors import UsageError
from gpucheck.probes.gpus import GpuRecord
from gpucheck.probes.xid_table import SEVERITIES, XidInfo, judge_xid
from gpucheck.report import Finding, Section, fail, ok, skip, warn

TITLE = "Kernel log: Xid errors"
DMESG_TIMEOUT_S = 5.0
JOURNAL_TIMEOUT_S = 10.0
SYSLOG_FILES = ("/var/log/kern.log", "/var/log/messages")
MAX_READ_BYTES = 256 * 1024**2  # a years-old kern.log: read only its tail
SAMPLE_CHARS = 120

_PCI = r"(?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
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
_BOOT_RE = re.compile(r"(?:kernel:|\])\s*(?:\[\s*\d+\.\d+\]\s*)?Linux version \d")
_TIME_RES = (
    # journalctl -o short-iso, dmesg --time-format iso
    re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s"),
    re.compile(r"^([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2})\s"),  # syslog, journalctl short
    re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]"),  # dmesg -T
    re.compile(r"\[\s*(\d+\.\d+)\]"),  # plain dmesg: seconds since boot
)


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


def _time_of(line: str) -> str | None:
    for pattern in _TIME_RES:
        match = pattern.search(line)
        if match:
            stamp = match.group(1)
            return f"{stamp} s after boot" if pattern is _TIME_RES[-1] else stamp
    return None


def _truncate(text: str) -> str:
    text = text.strip()
    return text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS - 1] + "…"


def parse_line(line: str) -> XidEvent | tuple[str, str] | None:
    """An Xid or fallen-off-the-bus event, a (bus id, UUID) pair, or None for other lines."""
    if "NVRM" not in line:
        return None
    match = _XID_RE.search(line)
    if match:
        instance = " ".join(match["mig"].split()) or None
        return XidEvent(_bus_id(match["pci"]), match["pci"], int(match["xid"]), _time_of(line),
                        match["detail"].strip()[:SAMPLE_CHARS * 4], instance=instance)
    match = _OFF_BUS_RE.search(line)
    if match:
        return XidEvent(_bus_id(match["pci"]), match["pci"], 79, _time_of(line),
                        "GPU has fallen off the bus.", off_bus_line=True)
    match = _UUID_RE.search(line)
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
    if "NVRM" not in line or parsed:
        return
    start = _LOST_RE.search(line)
    if start is not None:
        scan.lost = _Lost(start["pci"], _time_of(line), [])
    text = _NVRM_TEXT.search(line)
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


def scan_lines(lines: Iterable[str], boot_cut: bool = False) -> _Scan:
    """Parse every line; with `boot_cut`, keep only what follows the last boot banner."""
    scan = _Scan()
    for line in lines:
        if boot_cut and _BOOT_RE.search(line):
            scan = _Scan()
        scan.lines += 1
        parsed = parse_line(line)
        if isinstance(parsed, XidEvent):
            scan.events.append(parsed)
        elif parsed is not None:
            scan.uuids[parsed[0]] = parsed[1]
        _follow_lost(scan, line, parsed is not None)
    return scan


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as raw:
        return raw.read(2) == b"\x1f\x8b"


def _file_lines(path: str) -> Iterator[str]:
    """The lines of a text or gzip file; of a huge text one, only the last MAX_READ_BYTES."""
    if _is_gzip(path):  # nvidia-bug-report.log.gz, a compressed kern.log.1.gz
        with gzip.open(path) as unzipped:
            for chunk in unzipped:
                yield chunk.decode("utf-8", errors="replace")
        return
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        raw.seek(max(0, size - MAX_READ_BYTES))
        if size > MAX_READ_BYTES:
            raw.readline()  # a partial first line
        for chunk in raw:
            yield chunk.decode("utf-8", errors="replace")


def _from_scan(source: str, scan: _Scan, not_read: Sequence[str] = (),
               note: str | None = None) -> KernelLog:
    return KernelLog(source, scan.lines, tuple(scan.events), dict(scan.uuids),
                     tuple(not_read), note)


def read_file(path: str, boot_cut: bool = False, source: str | None = None) -> KernelLog:
    """A saved or on-disk kernel log; unreadable -> source None with the reason."""
    name = source or path
    try:
        cut_short = os.stat(path).st_size > MAX_READ_BYTES and not _is_gzip(path)
        scan = scan_lines(_file_lines(path), boot_cut)
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


def read_live_log(runner: Runner = run_command,
                  syslog_files: Sequence[str] = SYSLOG_FILES) -> KernelLog:
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
    for path in syslog_files:
        if not os.path.exists(path):
            not_read.append(f"{path}: not present")
            continue
        log = read_file(path, boot_cut=True)
        if log.source is not None:
            return KernelLog(log.source, log.lines_scanned, log.events, log.uuids_by_bus,
                             tuple(not_read), log.note)
        not_read.extend(log.not_read)
    return KernelLog(None, not_read=tuple(not_read))


def read_kernel_log(path: str | None = None, runner: Runner = run_command) -> KernelLog:
    """Phase 1: the saved log at `path` (`--kernel-log`), else this boot's live log."""
    return read_file(path) if path is not None else read_live_log(runner)


def checked_kernel_log_path(path: str | None) -> str | None:
    """`--kernel-log FILE`, once known readable; a UsageError (exit 2) when it is not."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"--kernel-log {path}: cannot read it "
                         f"({exc.strerror or type(exc).__name__})") from None
    return path


# ---- the section: one row per (GPU, XID), named by NVML ----

@dataclass(frozen=True)
class XidClass:
    """Every event of one XID on one GPU: how many, the first and last time, the
    verdict, and the sample of the line that decided it."""

    bus_id: str
    pci_id: str
    xid: int
    count: int
    first: str | None
    last: str | None
    sample: str
    info: XidInfo


def _verdict(xid: int, seen: Sequence[XidEvent],
             companions: set[int]) -> tuple[XidInfo, XidEvent]:
    """The verdict of one (GPU, XID) and the line behind it: for XID 154 the last line
    (the recovery action the GPU is in now: a later "to 0x0 (None)" means it was done),
    for any other the worst line (one fatal NVLink line among non-fatal ones)."""
    judged = [(judge_xid(xid, e.detail, companions), e) for e in seen]
    if xid == 154:
        return judged[-1]
    return max(judged, key=lambda pair: SEVERITIES.index(pair[0].severity))


def group_events(events: Iterable[XidEvent]) -> list[XidClass]:
    """One class per (GPU, XID), in order of first appearance.

    The driver often logs an Xid 79 line *and* a "fallen off the bus" line for the
    same loss: the latter counts only for a GPU with no Xid 79 line of its own.
    """
    groups: dict[tuple[str, int], list[XidEvent]] = {}
    off_bus: dict[tuple[str, int], list[XidEvent]] = {}
    for event in events:
        target = off_bus if event.off_bus_line else groups
        target.setdefault((event.bus_id, event.xid), []).append(event)
    for key, lost in off_bus.items():
        groups.setdefault(key, lost)
    companions: dict[str, set[int]] = {}
    for bus, xid in groups:
        companions.setdefault(bus, set()).add(xid)
    classes = []
    for (bus, xid), seen in groups.items():
        info, decider = _verdict(xid, seen, companions[bus] - {xid})
        classes.append(XidClass(bus, seen[0].pci_id, xid, len(seen), seen[0].time,
                                seen[-1].time, decider.sample, info))
    return classes


@dataclass(frozen=True)
class GpuName:
    """How a finding names a GPU, and its NVML index when this machine has it."""

    label: str
    nvml_index: int | None


def log_pci_name(bus_id: str) -> str:
    """"0000:B3:00.0" -> "0000:b3:00", the form of the driver's Xid lines: one GPU gets
    one name whether a line wrote 0000:b3:00, 0000:b3:00.0 or 00000000:B3:00.0."""
    head, _, function = bus_id.lower().rpartition(".")
    return head if head and function == "0" else bus_id.lower()


def gpu_name(bus_id: str, gpus: Sequence[GpuRecord], log_uuids: dict[str, str]) -> GpuName:
    """NVML's name for the GPU at this bus id, as every section names it
    ("GPU 3 (NVIDIA H200, bus 00000000:3B:00.0, GPU-...)"), else its PCI id as the
    driver writes it.

    A saved log from another machine can name a bus this one also has: when the log
    gives that GPU's UUID and NVML's differs, it is not the same GPU, so it stays unnamed.
    """
    log_uuid = log_uuids.get(bus_id)
    for gpu in gpus:
        if normal_bus_id(gpu.pci_bus_id) != bus_id:
            continue
        if log_uuid and gpu.uuid and log_uuid != gpu.uuid:
            break
        return GpuName(gpu.subject, gpu.index)
    return GpuName(f"PCI:{log_pci_name(bus_id)}" + (f" ({log_uuid})" if log_uuid else ""),
                   None)


def _row(group: XidClass, name: GpuName) -> dict[str, object]:
    info = group.info
    return {"gpu": name.label, "xid": group.xid, "count": group.count, "first": group.first,
            "last": group.last, "meaning": info.meaning, "severity": info.severity,
            "action": info.action, "sample": group.sample}


def _fault_finding(group: XidClass, name: GpuName, source: str) -> Finding:
    info = group.info
    when = "once" if group.count == 1 else f"{group.count} times"
    if group.first is not None:  # `dmesg -t` logs carry no time at all
        when += (f" at {group.first}" if group.count == 1
                 else f", first {group.first}, last {group.last}")
    message = (f"XID {group.xid} ({info.meaning}) {when} in the kernel log ({source}): "
               f"{group.sample}")
    index = "<index>" if name.nvml_index is None else str(name.nvml_index)
    hint = f"action: {info.action}: {info.advice.replace('<index>', index)}"
    verdict = fail if info.severity == "fail" else warn
    return verdict("kernel_log.xid", message, hint, name.label)


def _summary_finding(log: KernelLog, app_level: list[str], faults: int) -> Finding | None:
    """OK when nothing in the log is a GPU fault; app-level XIDs are listed as information."""
    where = f"source: {log.source}, {log.lines_scanned} lines"
    if app_level:
        only = "" if faults else " only"
        return ok("kernel_log.xid", f"XIDs that need no action on the GPU{only} "
                  f"(application-level or informational, not a GPU fault; {where}): "
                  + "; ".join(app_level))
    if faults:
        return None
    return ok("kernel_log.xid", f"no Xid in the kernel log ({where})")


def _unread_section(log: KernelLog | None, error: str | None) -> Section:
    """The section when no log could be read, or the probe itself broke."""
    if error is not None or log is None:
        error = error or "no result"
        return Section("kernel_log", TITLE, {"probe_error": error}, [fail(
            "kernel_log.probe", f"the kernel log probe failed: {error}",
            "run it again with --format json and report a gpucheck bug with the output")])
    tried = "; ".join(log.not_read) or "no source"
    return Section("kernel_log", TITLE, {"source": None, "not_read": list(log.not_read)}, [skip(
        "kernel_log.read", f"no kernel log this user can read ({tried}): run as root, or save "
        "it with `sudo dmesg > dmesg.txt` and pass --kernel-log dmesg.txt")])


def kernel_log_section(log: KernelLog | None, gpus: Sequence[GpuRecord],
                       error: str | None = None) -> Section:
    """Phase 2: the Xid history, each GPU named as NVML names it (`nvidia-smi -i N`)."""
    if log is None or log.source is None:
        return _unread_section(log, error)
    data: dict[str, object] = {"source": log.source, "lines_scanned": log.lines_scanned}
    if log.not_read:
        data["not_read"] = list(log.not_read)
    if log.note:
        data["note"] = log.note
    section = Section("kernel_log", TITLE, data)
    if log.lines_scanned == 0:
        section.findings.append(skip("kernel_log.read", f"the kernel log ({log.source}) is "
                                     "empty: nothing to check"))
        return section
    rows, app_level, faults = [], [], []
    for group in group_events(log.events):
        name = gpu_name(group.bus_id, gpus, log.uuids_by_bus)
        rows.append(_row(group, name))
        if group.info.severity == "info":
            app_level.append(f"XID {group.xid} ({group.info.meaning}) x{group.count} "
                             f"on {name.label}")
        else:
            faults.append(_fault_finding(group, name, log.source))
    data["xids"] = rows
    summary = _summary_finding(log, app_level, len(faults))
    section.findings.extend([*faults, *([summary] if summary else [])])
    return section
