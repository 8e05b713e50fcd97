"""Options declared once: each command's options are a dataclass whose fields carry
their argparse part (`opt`); a value out of range is refused by its type, so argparse
gives the one-line error and exit 2 (docs/bench.md, "Inputs").
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

OptionsT = TypeVar("OptionsT", bound="Options")

# Counts: beyond 2**40 nothing finishes (a typo), and a huge int would reach range().
MAX_COUNT = 2**40
# Longer than any run: beyond it a thread's timeout overflows or a deadline lands past
# every clock (--budget 1e10 was a traceback).
MAX_SECONDS = 7 * 24 * 3600.0


def real(above: float | None = None, least: float | None = None,
         most: float | None = None) -> Callable[[str], float]:
    """The argparse type of a finite number in range (nan and inf are refused: a NaN
    compares False with everything, so no later range check would fire)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text}: not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text}: not a finite number")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"{text}: give a number greater than {above:g}")
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"{text}: give {least:g} or more")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"{text}: too large (at most {most:g})")
        return value
    return parse


def count(least: int = -MAX_COUNT, most: int = MAX_COUNT) -> Callable[[str], int]:
    """The argparse type of a whole number (ASCII digits only) in range."""
    def parse(text: str) -> int:
        raw = text.strip()
        digits = raw.lstrip("+-")
        if not (digits.isascii() and digits.isdigit()) or len(raw) > 16:
            raise argparse.ArgumentTypeError(f"{text}: not a whole number (up to {MAX_COUNT})")
        value = int(raw)
        if value < least:
            raise argparse.ArgumentTypeError(f"{text}: give {least} or more")
        if value > most:
            raise argparse.ArgumentTypeError(f"{text}: too large (at most {most})")
        return value
    return parse


positive_float = real(above=0)
fraction = real(above=0, most=1)
seconds = real(above=0, most=MAX_SECONDS)
integer = count()
positive_int = count(least=1)
non_negative_int = count(least=0)


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    value = integer(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text}: not a TCP port; use 1024-65535")
    return value


def opt(*flags: str, default: Any = None, group: str | None = None,
        exclusive: str | None = None, **argparse_part: Any) -> Any:
    """A field of an `Options` dataclass: its default and its argparse part (`group`:
    its help heading; `exclusive`: the options of one name exclude each other)."""
    return field(default=default, metadata={"flags": flags, "group": group,
                                            "exclusive": exclusive, "argparse": argparse_part})


@dataclass(frozen=True)
class Options:
    """A command's options: `add_to(parser)` declares them, `of(args)` reads them back;
    `__post_init__` of a subclass checks what one option says about another."""

    @classmethod
    def add_to(cls, parser: argparse.ArgumentParser) -> None:
        groups: dict[str | None, Any] = {None: parser}
        for spec in fields(cls):
            meta = spec.metadata
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            where = groups[meta["group"]]
            if meta["exclusive"] is not None:
                if meta["exclusive"] not in groups:
                    groups[meta["exclusive"]] = where.add_mutually_exclusive_group()
                where = groups[meta["exclusive"]]
            named = {"dest": spec.name} if meta["flags"][0].startswith("-") else {}
            where.add_argument(*meta["flags"], **named, default=spec.default,
                               **meta["argparse"])

    @classmethod
    def of(cls: type[OptionsT], args: argparse.Namespace | Options) -> OptionsT:
        return cls(**{spec.name: getattr(args, spec.name) for spec in fields(cls)})
