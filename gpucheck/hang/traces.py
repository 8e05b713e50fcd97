"""Flight Recorder dumps: loaded with torch's own reader, judged here.

torch keeps, per process group, a ring buffer of the last collectives each rank
issued (TORCH_FR_BUFFER_SIZE entries) and writes it to `<TORCH_FR_DUMP_TEMP_FILE><rank>`
(NCCL: on a watchdog timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1; any backend:
`torch._C._distributed_c10d._dump_fr_trace_file(rank)`; docs/hang.md). Each file is
read with `torch.distributed.flight_recorder.components.loader.read_dump`, the
reader of torch's fr_trace tool.

Its analyzer (`build_db`) is not used: with torch 2.15 it raises KeyError on gloo
dumps (the group's config is recorded under the name '' while entries name it '0'),
and it judges ranks against whichever rank's file it reads first, so the culprit it
names depends on the file order. Here every rank's n-th collective of a group is
compared with every other rank's; at the first collective where they differ, the
ranks in the majority are taken as right and the others named: those that never
reached it, or called another op, size or dtype. A tie names no one, except that
ranks that never arrived lose a tie against ranks that did (those wait for them).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucheck.errors import UsageError

MISSING = "not reached"
# Ops whose every rank passes the same shapes (all_gather, gather, scatter and
# all_to_all legitimately differ by rank or root: their op and dtypes are compared).
SAME_SIZES = {"all_reduce", "allreduce", "broadcast", "reduce", "allreduce_coalesced",
              "barrier", "all_reduce_coalesced"}
_NAME = re.compile(r"^(.*?)(\d+)$")


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
    """rank -> path of the dumps in `directory` (files named <prefix><rank>; without
    a prefix, the most common one)."""
    if not os.path.isdir(directory):
        raise UsageError(f"--traces {directory}: no such directory; give the folder "
                         "TORCH_FR_DUMP_TEMP_FILE's prefix points into")
    by_prefix: dict[str, dict[int, str]] = {}
    for name in sorted(os.listdir(directory)):
        match = _NAME.match(name)
        path = os.path.join(directory, name)
        if match and os.path.isfile(path):
            by_prefix.setdefault(match[1], {})[int(match[2])] = path
    if prefix is not None:
        return by_prefix.get(prefix, {})
    if not by_prefix:
        return {}
    return max(by_prefix.values(), key=len)


def load(files: Mapping[int, str]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """(rank -> dump, one line per file torch could not read), through torch's reader
    (a pickle: read only your own jobs' dumps). A rank that died while dumping leaves
    a truncated file: it counts as no dump, the others are still judged."""
    from torch.distributed.flight_recorder.components.loader import read_dump

    dumps, unreadable = {}, []
    for rank, path in files.items():
        match = _NAME.match(os.path.basename(path))
        prefix = match[1] if match else ""  # read_dump takes the file name's prefix
        try:
            dumps[rank] = read_dump(prefix, path)
        except Exception as exc:  # truncated or foreign: say which, go on
            unreadable.append(f"{path}: not a Flight Recorder dump torch can read "
                              f"({type(exc).__name__}: {str(exc)[:120]})")
    return dumps, unreadable


def _op(entry: Mapping[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "?")
    return name.split(":", 1)[1] if ":" in name else name


def _call(entry: Mapping[str, Any]) -> Call:
    op = _op(entry)
    sizes = str(entry.get("input_sizes")) if op in SAME_SIZES else ""
    dtypes = str(entry.get("input_dtypes") or "")
    return Call(op, sizes, dtypes)


def _members(dumps: Mapping[int, Mapping[str, Any]], name: str, desc: str) -> set[int]:
    """The group's ranks from the dumps' pg_config: under its name, else (gloo records
    its config under '') the one config of a rank that has only one."""
    members: set[int] = set()
    for dump in dumps.values():
        config = dump.get("pg_config") or {}
        entry = config.get(name) or (next(iter(config.values())) if len(config) == 1
                                     and desc == "default_pg" else None)
        if entry and entry.get("ranks"):
            ranks = entry["ranks"]
            members.update(ast.literal_eval(ranks) if isinstance(ranks, str) else ranks)
    return members


def groups(dumps: Mapping[int, Mapping[str, Any]]) -> list[GroupTrace]:
    """Every process group's collectives, per rank (point-to-point ops are left out:
    they pair two ranks, not the group)."""
    found: dict[str, GroupTrace] = {}
    for rank, dump in dumps.items():
        for entry in dump.get("entries") or []:
            if entry.get("is_p2p"):
                continue
            name, desc = (*(entry.get("process_group") or ()), "?", "?")[:2]
            group = found.setdefault(str(name), GroupTrace(str(name), str(desc), []))
            seq = int(entry["collective_seq_id"])
            group.calls.setdefault(rank, {})[seq] = _call(entry)
            if entry.get("state") == "completed":  # NCCL records it; gloo never does
                group.completed[rank] = max(seq, group.completed.get(rank, 0))
    for group in found.values():
        members = _members(dumps, group.name, group.desc) | set(group.calls)
        group.members = sorted(members)
    return sorted(found.values(), key=lambda g: (g.desc != "default_pg", g.name))
