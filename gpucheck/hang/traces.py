"""Flight Recorder dumps read with no code run (every class refused, sizes bounded,
fields type-checked), grouped per process group (docs/hang.md, "Reading dumps safely")."""

from __future__ import annotations

import io
import os
import pickle
import re
import reprlib
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucheck.errors import UsageError

MISSING = "not reached"
# Ops whose every rank passes the same shapes (all_gather, gather, scatter and
# all_to_all legitimately differ by rank or root: their op and dtypes are compared).
SAME_SIZES = {"all_reduce", "allreduce", "broadcast", "reduce", "allreduce_coalesced",
              "barrier", "all_reduce_coalesced"}
# A rank of at most 7 digits: int() of a longer run of digits is slow or refused.
_NAME = re.compile(r"^(.*?)(\d{1,7})$")
# A 2000-entry NCCL dump is a few MB: beyond these a file is no dump worth the memory.
MAX_DUMP_BYTES = 128 * 1024 * 1024
MAX_ENTRIES = 200_000
# The unpickled value written out as a tree (a pickle's memo lets 779 bytes stand for
# 10**30 nested lists); a real dump nests about 6 deep, about its file size.
MAX_WRITTEN_OUT = 4 * MAX_DUMP_BYTES
MAX_DEPTH = 32
_RANKS = re.compile(r"^\s*[\[(]?\s*(-?\d{1,7}\s*(,\s*-?\d{1,7}\s*)*,?)?\s*[\])]?\s*$")


class UnsafeDump(UsageError):
    """A file among the dumps names a Python class: refused, nothing of it was run."""


class NotADump(Exception):
    """A file that is no Flight Recorder dump (damaged, truncated or foreign)."""


class PlainUnpickler(pickle.Unpickler):
    """Plain values only: a class or function a pickle names is refused unimported."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"names {module}.{name}"[:160])

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("uses a persistent id")


@dataclass(frozen=True)
class Call:
    """One rank's n-th collective in a group: what the others must match."""

    op: str
    sizes: str
    dtypes: str

    def describe(self) -> str:
        return f"{self.op} {self.sizes} {self.dtypes}".strip()


@dataclass
class GroupTrace:
    """One process group: per rank, seq id -> Call; the members the group lists."""

    name: str
    desc: str
    members: list[int]
    calls: dict[int, dict[int, Call]] = field(default_factory=dict)
    # rank -> its last collective recorded as completed (NCCL's watchdog sets the state;
    # gloo leaves every entry "scheduled", so gloo dumps have none).
    completed: dict[int, int] = field(default_factory=dict)


def dump_files(directory: str, prefix: str | None = None) -> dict[int, str]:
    """rank -> path of the regular files named <prefix><rank> (default: the most common
    prefix)."""
    if not os.path.isdir(directory):
        raise UsageError(f"--traces {directory}: no such directory; give the folder "
                         "TORCH_FR_DUMP_TEMP_FILE's prefix points into")
    by_prefix: dict[str, dict[int, str]] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        raise UsageError(f"--traces {directory}: cannot list it ({exc.strerror}); "
                         "run as a user who may read it") from None
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and _regular(entry):
            by_prefix.setdefault(match[1], {})[int(match[2])] = entry.path
    if prefix is not None:
        return by_prefix.get(prefix, {})
    return max(by_prefix.values(), key=len, default={})


def _regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)  # a link is never followed
    except OSError:
        return False


def load(files: Mapping[int, str]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """(rank -> dump, one line per file that is no readable dump, such as one cut short
    by a dying rank); UnsafeDump for a file that names a class."""
    dumps, unreadable = {}, []
    for rank, path in files.items():
        try:
            dumps[rank] = _checked(read_dump(path), rank)
        except NotADump as exc:
            unreadable.append(f"{path}: not a Flight Recorder dump ({exc})")
    return dumps, unreadable


def read_dump(path: str) -> Any:

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise NotADump(f"cannot open it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotADump("not a regular file")
        if info.st_size > MAX_DUMP_BYTES:
            raise NotADump(f"{info.st_size} bytes, more than the {MAX_DUMP_BYTES} a dump "
                           "can have")
        raw = handle.read(MAX_DUMP_BYTES + 1)
    try:
        value = PlainUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as exc:
        if str(exc).startswith(("names ", "uses a persistent")):
            raise UnsafeDump(f"--traces: {path} {exc}, which a Flight Recorder dump never "
                             "does: refused, nothing in it was run; remove the file, "
                             "and read only dumps your jobs wrote") from None
        raise NotADump(f"{type(exc).__name__}: {str(exc)[:120]}") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError, OverflowError) as exc:
        raise NotADump(f"{type(exc).__name__}: {str(exc)[:120]}") from None
    _bounded(value)
    return value


def _children(value: Any) -> list[Any] | None:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    return None


def _bounded(root: Any) -> None:
    """NotADump when `root` written out exceeds MAX_WRITTEN_OUT or MAX_DEPTH, or holds
    itself; each container weighed once, its weight reused where shared."""
    weight: dict[int, tuple[int, int]] = {}  # id -> (written-out size, depth)
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        kids = _children(node)
        if kids is None or (not leaving and id(node) in weight):
            continue
        if leaving:
            entered.discard(id(node))
            weight[id(node)] = _weigh(kids, weight)
        elif id(node) in entered:
            raise NotADump("a value that contains itself")
        else:
            entered.add(id(node))
            stack.append((node, True))
            stack.extend((kid, False) for kid in kids)


def _weigh(kids: list[Any], weight: dict[int, tuple[int, int]]) -> tuple[int, int]:
    size, depth = 1, 1
    for kid in kids:
        kid_size, kid_depth = weight[id(kid)] if _children(kid) is not None else \
            (1 + len(kid) if isinstance(kid, str | bytes | bytearray) else 1, 0)
        size, depth = size + kid_size, max(depth, kid_depth + 1)
    if size > MAX_WRITTEN_OUT:
        raise NotADump(f"shared references that write out to more than {MAX_WRITTEN_OUT} "
                       "values")
    if depth > MAX_DEPTH:
        raise NotADump(f"values nested more than {MAX_DEPTH} deep")
    return size, depth


def _checked(raw: Any, rank: int) -> dict[str, Any]:
    """The fields judging reads, type-checked; entries that are no record dropped."""
    if not isinstance(raw, dict):
        raise NotADump(f"a {type(raw).__name__}, not a dict")
    entries = raw.get("entries", [])
    if not isinstance(entries, list | tuple):
        raise NotADump(f"'entries' is a {type(entries).__name__}, not a list")
    if len(entries) > MAX_ENTRIES:
        raise NotADump(f"{len(entries)} entries, more than the {MAX_ENTRIES} a buffer holds")
    kept = [e for e in entries if isinstance(e, dict) and _seq(e) is not None]
    config = raw.get("pg_config")
    return {"rank": rank, "version": _text(raw.get("version", "?"), 40),
            "entries": kept, "dropped": len(entries) - len(kept),
            "pg_config": config if isinstance(config, dict) else {}}


def _seq(entry: Mapping[str, Any]) -> int | None:
    """The entry's collective sequence number (older torch: `seq_id`), if it is one."""
    seq = entry.get("collective_seq_id", entry.get("seq_id"))
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 4, 300, 60, 40
_SHOWN.maxlist = _SHOWN.maxtuple = 64


def _text(value: Any, limit: int = 300) -> str:
    """A value from a file as bounded text (a huge number is never built whole)."""
    if isinstance(value, str):
        return value[:limit]
    try:
        return _SHOWN.repr(value)[:limit]
    except (RecursionError, MemoryError, ValueError):
        return "?"


def _call(entry: Mapping[str, Any]) -> Call:
    name = _text(entry.get("profiling_name") or "?")  # "nccl:all_reduce"
    op = name.split(":", 1)[1] if ":" in name else name
    sizes = _text(entry.get("input_sizes")) if op in SAME_SIZES else ""
    dtypes = _text(entry.get("input_dtypes") or "")
    return Call(op, sizes, dtypes)


def _ranks(value: Any) -> set[int]:
    """A group's ranks as torch records them ("[0, 1]", or a list of ints), else none."""
    if isinstance(value, str):
        if len(value) > 10_000_000 or not _RANKS.match(value):
            return set()
        return {int(r) for r in re.findall(r"-?\d+", value)}
    if isinstance(value, list | tuple):
        return {r for r in value if isinstance(r, int) and not isinstance(r, bool)}
    return set()


def _members(dumps: Mapping[int, Mapping[str, Any]], name: str, desc: str) -> set[int]:
    """The group's ranks from pg_config: under its name, else (gloo) a rank's only one."""
    members: set[int] = set()
    for dump in dumps.values():
        config = dump.get("pg_config")
        if not isinstance(config, dict):
            continue
        entry = config.get(name) or (next(iter(config.values())) if len(config) == 1
                                     and desc == "default_pg" else None)
        if isinstance(entry, dict):
            members |= _ranks(entry.get("ranks"))
    return members


def groups(dumps: Mapping[int, Mapping[str, Any]]) -> list[GroupTrace]:
    """Every process group's collectives per rank (point-to-point ops left out)."""
    found: dict[str, GroupTrace] = {}
    for rank, dump in dumps.items():
        entries = dump.get("entries")
        for entry in entries if isinstance(entries, list | tuple) else []:
            seq = _seq(entry) if isinstance(entry, dict) else None
            if seq is None or entry.get("is_p2p"):
                continue
            key = entry.get("process_group")  # (name, desc); "?" where torch recorded none
            parts = list(key[:2]) if isinstance(key, list | tuple) else []
            name, desc = (_text(part, 100) for part in (*parts, "?", "?")[:2])
            group = found.setdefault(name, GroupTrace(name, desc, []))
            group.calls.setdefault(rank, {})[seq] = _call(entry)
            if entry.get("state") == "completed":  # NCCL records it; gloo never does
                group.completed[rank] = max(seq, group.completed.get(rank, 0))
    for group in found.values():
        members = _members(dumps, group.name, group.desc) | set(group.calls)
        group.members = sorted(members)
    return sorted(found.values(), key=lambda g: (g.desc != "default_pg", g.name))
