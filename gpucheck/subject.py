"""What a finding or a figure is about: a rank, a GPU, a pair, a node, a port, a host,
a file or the whole job, as fields (not a display string to parse back). Renderers print
`label`; compare, charts, prometheus and line read the fields. Imports nothing from gpucheck.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping
from typing import Any


class Kind(str, enum.Enum):
    RANK = "rank"
    RANKS = "ranks"  # several ranks named together ("rank(s) 1, 3 left no dump")
    GPU = "gpu"
    PAIR = "pair"
    NODE = "node"
    PORT = "port"
    HOST = "host"
    FILE = "file"
    JOB = "job"
    TEXT = "text"  # a name, not a place: a setting, a command, a message size


_RANK, _GPU, _NODE, _PAIR = Kind.RANK, Kind.GPU, Kind.NODE, Kind.PAIR  # no enum lookups
_WORD = {kind: kind.value for kind in Kind}  # Enum.value is a slow property
_INT_FIELDS = ("rank", "gpu", "node", "peer")
_TEXT_FIELDS = ("bus_id", "uuid", "host", "port")
_FIELDS = ("rank", "gpu", "bus_id", "uuid", "node", "host", "peer", "port", "ranks")
_FIELD_SET = frozenset(_FIELDS)


@dataclasses.dataclass(frozen=True, slots=True)
class Subject:
    """`label` is what people read ("rank 3", "GPU 5 (0000:17:00.0)", "cuda:0 -> cuda:1");
    the other fields are what programs read. A pair names its first member in `rank`,
    `gpu` or `node` and the second in `peer`. `str()` and `format()` give the label; a
    Subject equals only a Subject with every field equal (never a str)."""

    kind: Kind
    label: str
    rank: int | None = None
    gpu: int | None = None
    bus_id: str | None = None
    uuid: str | None = None
    node: int | None = None
    host: str | None = None
    peer: int | None = None
    port: str | None = None
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", Kind(self.kind))
        if self.ranks is not None:
            object.__setattr__(self, "ranks", tuple(self.ranks))

    def __str__(self) -> str:
        return self.label

    def __format__(self, spec: str) -> str:
        return format(self.label, spec)

    def __repr__(self) -> str:
        set_fields = "".join(f", {n}={getattr(self, n)!r}" for n in _FIELDS
                             if getattr(self, n) is not None)
        return f"Subject({self.kind.value}, {self.label!r}{set_fields})"

    def position(self) -> str | None:
        """The slot a figure is kept under across reports: "rank3", "gpu5",
        "cuda0_to_cuda1", "rank0_to_rank1", "node2"; None for hosts, files, the job."""
        if self.kind is _PAIR and self.peer is not None:
            for prefix, first in (("rank", self.rank), ("cuda", self.gpu), ("node", self.node)):
                if first is not None:
                    return f"{prefix}{first}_to_{prefix}{self.peer}"
            return None
        number = self._own_number()
        return None if number is None else f"{_WORD[self.kind]}{number}"

    def _own_number(self) -> int | None:
        """The number of a rank, GPU or node subject: its own kind's field."""
        kind = self.kind
        return self.rank if kind is _RANK else self.gpu if kind is _GPU \
            else self.node if kind is _NODE else None

    def short_name(self) -> str:
        """A few words for a one-line summary ("node 1 GPU 3", "rank 2"), from the fields;
        the label where no number names it."""
        number = self._own_number()
        if number is None:
            return self.label
        word = "GPU" if self.kind is Kind.GPU else self.kind.value
        on_node = f"node {self.node} " if self.node is not None and self.kind is not Kind.NODE \
            else ""
        return f"{on_node}{word} {number}"

    def to_dict(self) -> dict[str, Any]:
        """`{"kind", "label", ...}` with only the fields that are set."""
        raw: dict[str, Any] = {"kind": self.kind.value, "label": self.label}
        raw.update((n, getattr(self, n)) for n in _FIELDS if getattr(self, n) is not None)
        if self.ranks is not None:
            raw["ranks"] = list(self.ranks)
        return raw

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Subject:
        """Read back what `to_dict` wrote; TypeError or ValueError on any other shape
        (a report file is data). A fleet's reports repeat their subjects: each is read once."""
        if type(raw) is not dict:
            return cls._read(raw)
        # The values' types are part of the key: `true` and `1.0` equal 1 but are refused.
        key = (tuple(raw.items()), tuple(map(type, raw.values())))
        try:
            return _READ[key]
        except KeyError:
            pass
        except TypeError:  # a list ("ranks") cannot be a key
            return cls._read(raw)
        subject = _READ[key] = cls._read(raw)
        if len(_READ) > _READ_MAX:
            _READ.clear()
        return subject

    @classmethod
    def _read(cls, raw: Mapping[str, Any]) -> Subject:
        if not isinstance(raw, Mapping):
            raise TypeError(f"a subject is an object or a string, not {type(raw).__name__}")
        label = raw.get("label")
        if not isinstance(label, str):
            raise TypeError("a subject's 'label' is not a string")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if value is None or key not in _FIELD_SET:
                continue
            if key == "ranks":
                if not isinstance(value, list) or not all(_is_int(r) for r in value):
                    raise TypeError("a subject's 'ranks' is not a list of integers")
            elif key in _INT_FIELDS and not _is_int(value):
                raise TypeError(f"a subject's {key!r} is not an integer")
            elif key in _TEXT_FIELDS and not isinstance(value, str):
                raise TypeError(f"a subject's {key!r} is not a string")
            values[key] = value
        return cls(Kind(raw.get("kind")), label, **values)

    def on_node(self, index: int, label: str, host: str | None = None) -> Subject:
        """This subject of one node's report placed in a job's report: `label` is the
        new words ("node 1 (h1) GPU 3 (...)"); `node` and `host` fill the fields it lacks.
        A subject known only by its words has no other place: it becomes that node's."""
        return dataclasses.replace(
            self, kind=Kind.NODE if self.kind is Kind.TEXT else self.kind, label=label,
            node=index if self.node is None else self.node,
            host=host if self.host is None else self.host)


# Subjects read so far, by their JSON items (frozen: one object serves every report).
_READ: dict[tuple[tuple[tuple[str, Any], ...], tuple[type, ...]], Subject] = {}
_READ_MAX = 1 << 14


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def rank(number: int, label: str | None = None, *, gpu: int | None = None,
         bus_id: str | None = None, host: str | None = None,
         node: int | None = None) -> Subject:
    return Subject(Kind.RANK, label or f"rank {number}", rank=number, gpu=gpu,
                   bus_id=bus_id, host=host, node=node)


def ranks(numbers: Iterable[int], label: str | None = None) -> Subject:
    """Several ranks one finding names together (the ranks that wrote no dump, that
    agree on a wrong result): `ranks` holds them all, in order, even when the label
    shortens the list. One rank is `rank(n)`: a reader of rank fields finds it there."""
    held = tuple(numbers)
    if len(held) == 1:
        return rank(held[0], label)
    return Subject(Kind.RANKS, label or f"rank {', '.join(map(str, held))}", ranks=held)


def gpu(index: int | None, label: str | None = None, *, bus_id: str | None = None,
        uuid: str | None = None, rank: int | None = None,
        host: str | None = None, ranks: Iterable[int] | None = None) -> Subject:
    """A physical GPU (`index`: NVML's, None when NVML could not tell; then `label`
    names it); `rank` the one rank that used it, `ranks` when several shared it."""
    words = label or (f"GPU {index}" if index is not None else "a GPU")
    return Subject(Kind.GPU, words, gpu=index, bus_id=bus_id, uuid=uuid, rank=rank,
                   host=host, ranks=None if ranks is None else tuple(ranks))


def pair(first: int, second: int, label: str | None = None, *, by: str = "rank") -> Subject:
    """Two ranks (`by="rank"`), two GPUs of one node (`"cuda"`) or two nodes (`"node"`)."""
    shown = {"rank": "rank {}", "cuda": "cuda:{}", "node": "node {}"}.get(by)
    if shown is None:
        raise ValueError(f"a pair is by rank, cuda or node, not {by!r}")
    text = label or f"{shown.format(first)} -> {shown.format(second)}"
    return Subject(Kind.PAIR, text, peer=second, rank=first if by == "rank" else None,
                   gpu=first if by == "cuda" else None, node=first if by == "node" else None)


def node(index: int, label: str | None = None, *, host: str | None = None) -> Subject:
    return Subject(Kind.NODE, label or f"node {index}", node=index, host=host)


def port(name: str, label: str | None = None, *, host: str | None = None) -> Subject:
    """An InfiniBand/RoCE port ("mlx5_0/1")."""
    return Subject(Kind.PORT, label or f"hca port {name}", port=name, host=host)


def host(name: str) -> Subject:
    return Subject(Kind.HOST, name, host=name)


def file(path: str) -> Subject:
    return Subject(Kind.FILE, path)


def job(label: str = "the job") -> Subject:
    return Subject(Kind.JOB, label)


@functools.lru_cache(maxsize=4096)  # a fleet's findings repeat their subjects' words
def text(label: str) -> Subject:
    """A subject that is a name, not a place a reader locates: a setting or fact compared
    ("CUDA_VISIBLE_DEVICES", "driver"), a command, a message size, a NUMA node. Its
    words are its identity; JSON stores no fields for it. Never a rank, GPU, pair, node,
    port, host or file: those have their constructors."""
    return Subject(Kind.TEXT, label)
