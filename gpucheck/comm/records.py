"""The records comm's ranks send to rank 0, as frozen dataclasses, and rank 0's reading of
them back (`read_comm`). Plain data, no torch: the ranks build them
(gpucheck.comm.pairwise), the report (gpucheck.comm.report) reads them.

They cross as plain dicts (what `all_gather_object` carries and rank 0's partial results
file holds), so the report's JSON keeps its shape; rank 0 reads each one back with
`gpucheck.records.read`, and a row that does not read is left out of the verdicts and
named in a `comm.rank_record` finding, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.records import Unread, as_dict, read_all


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

    def to_dict(self) -> dict[str, Any]:
        """The row as it crosses: `samples_gbps` and `path` only when known."""
        row = as_dict(self)
        for key in ("samples_gbps", "path"):
            if row[key] is None:
                del row[key]
        if self.samples_gbps is not None:
            row["samples_gbps"] = list(self.samples_gbps)
        return row


@dataclass(frozen=True)
class CommRank:
    """One entry of the results' roll of ranks, as the report reads it (the rank's check-in,
    gpucheck.distributed.checkin.RankInfo; every other key kept in the raw entry)."""

    rank: int
    node_rank: int
    host: str
    device: str


@dataclass(frozen=True)
class CommRecords:
    """Every per-rank record of a comm result that read back, and the ones that did not."""

    entries: tuple[Mapping[str, Any], ...]  # the raw entries of the ranks that read
    pairs: tuple[PairRow, ...]
    pairs_again: tuple[PairRow, ...]
    nodes_again_pairs: tuple[PairRow, ...]
    unread: tuple[Unread, ...]


def read_comm(result: Mapping[str, Any]) -> CommRecords:
    """Every per-rank record of `result` (complete or partial) read back."""
    unread: list[Unread] = []

    def rows(raw: object, what: str) -> tuple[PairRow, ...]:
        good, bad = read_all(PairRow, raw, what)
        unread.extend(bad)
        return tuple(good)

    pairwise = _mapping(result.get("pairwise"))
    again = _mapping(result.get("nodes_again"))
    ranks, bad = read_all(CommRank, result.get("ranks"), "entry in the roll of ranks")
    unread.extend(bad)
    kept = {r.rank for r in ranks}
    raw_ranks = result.get("ranks")
    entries = tuple(e for e in raw_ranks if isinstance(e, Mapping) and e.get("rank") in kept
                    and not read_all(CommRank, [e], "")[1]) \
        if isinstance(raw_ranks, (list, tuple)) else ()
    return CommRecords(entries=entries,
                       pairs=rows(pairwise.get("pairs"), "pairwise row"),
                       pairs_again=rows(pairwise.get("again"), "pairwise row (measured again)"),
                       nodes_again_pairs=rows(again.get("pairs"),
                                              "pairwise row (a slow node measured again)"),
                       unread=tuple(unread))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_back(result: Mapping[str, Any], records: CommRecords) -> dict[str, Any]:
    """`result` with every per-rank list replaced by the records of it that read (as the
    dicts they crossed as): what the verdicts, tables and metrics then read."""
    out = dict(result)
    out["ranks"] = list(records.entries)
    pairwise, again = result.get("pairwise"), result.get("nodes_again")
    if isinstance(pairwise, Mapping):
        out["pairwise"] = {**pairwise, "pairs": [p.to_dict() for p in records.pairs]}
        if "again" in pairwise:
            out["pairwise"]["again"] = [p.to_dict() for p in records.pairs_again] \
                if pairwise["again"] is not None else None
    if isinstance(again, Mapping) and "pairs" in again:
        out["nodes_again"] = {**again, "pairs": [p.to_dict() for p in records.nodes_again_pairs]}
    return out
