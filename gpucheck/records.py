"""The typed records ranks send to rank 0 as plain dicts, read back field by field into
their dataclass or a `RecordError` naming the field (a finding, never a crash). Floor 1."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # the typeshed protocol every dataclass satisfies
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")

class RecordError(ValueError):
    """A record that does not have its class's shape: says which field and why."""


def _fits(value: object, hint: Any) -> bool:
    """Whether `value` (as JSON or pickle hands it over) has the declared type."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return isinstance(value, (list, tuple)) and all(_fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def _value(value: object, hint: Any) -> object:
    """A list becomes the tuple the frozen record declares."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    arms = typing.get_args(hint) if union else (hint,)
    if isinstance(value, list) and any(typing.get_origin(a) is tuple for a in arms):
        return tuple(value)
    return value


def read(cls: type[R], raw: object) -> R:
    """`raw` (a dict) as a `cls` record; RecordError naming the first field that does not
    fit. Keys the class does not declare are ignored (a newer rank's extra figures)."""
    if not isinstance(raw, Mapping):
        raise RecordError(f"not a record but {type(raw).__name__}")
    values = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        has_default = field.default is not dataclasses.MISSING or \
            field.default_factory is not dataclasses.MISSING
        if field.name not in raw:
            if has_default:
                continue
            raise RecordError(f"no {field.name}")
        if not _fits(raw[field.name], hint):
            raise RecordError(f"{field.name} is {_shown(raw[field.name])}, not {_words(hint)}")
        values[field.name] = _value(raw[field.name], hint)
    return cls(**values)


def _shown(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _words(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def as_dict(record: DataclassInstance) -> dict[str, Any]:
    """The record as the plain dict it crosses as (tuples stay tuples until JSON)."""
    return dataclasses.asdict(record)


@dataclasses.dataclass(frozen=True)
class Unread:
    """One record rank 0 could not read: where it came from and why."""

    what: str  # "gemm record", "pairwise row"
    rank: int | None  # the sender, when the record names one
    why: str


def read_all(cls: type[R], rows: object, what: str,
             sender: tuple[str, ...] = ("rank", "src")) -> tuple[list[R], list[Unread]]:
    """The rows of `rows` that read as `cls`, and the ones that do not with their sender
    (the first of the `sender` keys holding an int)."""
    if rows is None:
        return [], []
    if not isinstance(rows, (list, tuple)):
        return [], [Unread(what, None, f"not a list but {type(rows).__name__}")]
    good, bad = [], []
    for row in rows:
        try:
            good.append(read(cls, row))
        except RecordError as error:
            bad.append(Unread(what, _sender(row, sender), str(error)))
    return good, bad


def readable(cls: type[R], rows: object) -> list[Mapping[str, Any]]:
    """The rows of `rows` that read as `cls`, as sent (every key kept)."""
    if not isinstance(rows, (list, tuple)):
        return []
    return [row for row in rows if isinstance(row, Mapping) and _reads(cls, row)]


def _reads(cls: type[R], row: Mapping[str, Any]) -> bool:
    try:
        read(cls, row)
    except RecordError:
        return False
    return True


def _sender(row: object, keys: tuple[str, ...]) -> int | None:
    if isinstance(row, Mapping):
        for key in keys:
            value = row.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None
