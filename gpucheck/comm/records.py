"""The records comm's ranks send to rank 0 (as plain dicts, so the report's JSON keeps
its shape) and rank 0's reading of them back: a row that does not read is left out of
the verdicts and named in a `comm.rank_record` finding, never a crash."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from gpucheck.records import R, RecordError, Unread, as_dict, read_all, readable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class PairRow:
    """One ordered pair's send/recv bandwidth, as its sender measured it."""

    src: int
    dst: int
    node_rank: int  # the sender's
    size_bytes: int
    bandwidth_gbps: float  # the median of the repeats
    samples_gbps: tuple[float, ...] | None = None  # every repeat (None: one timing)
    path: str | None = None  # the path class (NV#, PIX, SYS...) when NVML told it


@dataclass(frozen=True)
class LinkRow:
    """One rail link between two nodes in one round, as its receiver measured it (NCCL:
    with its sender's figures merged in, `internode_verdicts.both_ends`)."""

    round: int | str  # the round's shift, or "again" (a second look)
    src_node: int
    dst_node: int
    rail: int
    src: int
    dst: int
    bandwidth_gbps: float
    samples_gbps: tuple[float, ...] | None = None
    received_gbps: tuple[float, ...] | None = None
    sent_gbps: tuple[float, ...] | None = None


@dataclass(frozen=True)
class SentRow:
    """What a sending rank timed of one link (NCCL: its group's time, both directions)."""

    round: int | str
    src_node: int
    dst_node: int
    src: int
    dst: int
    sent_gbps: tuple[float, ...] | None


def crossing(record: DataclassInstance) -> dict[str, Any]:
    """A record as the plain dict it crosses as: tuples as lists (as JSON has them), a
    field whose default is None left out while None."""
    optional = {f.name for f in fields(record) if f.default is None}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in as_dict(record).items()
            if v is not None or k not in optional}


@dataclass(frozen=True)
class TransportEntry:
    """What one rank read of NCCL's init log; `transport` (a `Transport` dict) when read."""

    rank: int
    state: str  # "read", "user_nccl_debug", "no_log"
    transport: dict[str, Any] | None
    ib_sysfs: tuple[str, ...] = ()  # the node's InfiniBand/RoCE devices

    def __post_init__(self) -> None:
        if self.state == "read" and self.transport is None:
            raise RecordError("state is 'read' but no transport")


@dataclass(frozen=True)
class CommRank:
    """One entry of the roll of ranks, as the report reads it."""

    rank: int
    node_rank: int
    host: str
    device: str


@dataclass(frozen=True)
class CommRecords:
    """Every per-rank record of a comm result that read back, and the ones that did not;
    a second look's rows are None when the run ended before it."""

    entries: tuple[Mapping[str, Any], ...]  # the raw entries of the ranks that read
    pairs: tuple[PairRow, ...]
    pairs_again: tuple[PairRow, ...] | None
    node_pairs: tuple[PairRow, ...]  # a slow node's pairs measured again
    links: tuple[LinkRow, ...]
    links_again: tuple[LinkRow, ...] | None
    transport: tuple[TransportEntry, ...] | None  # None: not gathered (gloo, an early end)
    unread: tuple[Unread, ...]


def read_comm(result: Mapping[str, Any]) -> CommRecords:
    """Every per-rank record of `result` (complete or partial) read back."""
    unread = list(read_all(CommRank, result.get("ranks"), "entry in the roll of ranks")[1])

    def rows(name: str, key: str, cls: type[R], what: str) -> tuple[R, ...] | None:
        part = result.get(name) if key else result
        raw = part.get(key or name) if isinstance(part, Mapping) else None
        if raw is None:
            return None
        # A pair's row comes from its sender, a link's from its receiver.
        good, bad = read_all(cls, raw, what, ("dst",) if cls is LinkRow else ("rank", "src"))
        unread.extend(bad)
        return tuple(good)

    return CommRecords(
        tuple(readable(CommRank, result.get("ranks"))),
        rows("pairwise", "pairs", PairRow, "pairwise row") or (),
        rows("pairwise", "again", PairRow, "pairwise row (measured again)"),
        rows("nodes_again", "pairs", PairRow, "pairwise row (a slow node measured again)")
        or (),
        rows("internode", "links", LinkRow, "node-to-node link") or (),
        rows("internode", "again", LinkRow, "node-to-node link (measured again)"),
        rows("transport", "", TransportEntry, "NCCL transport entry"), tuple(unread))
