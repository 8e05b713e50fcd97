"""Numbers in words and out of records: byte counts, and a figure read defensively. Floor
1: imports nothing from gpucheck, so workers, probes, readers and renderers all use it."""

from __future__ import annotations

import math

_EXACT_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def human_bytes(size: int) -> str:
    """An exact size in the largest unit that divides it: a buffer size ("64 MiB",
    "1536 B"); never rounded, so two sizes never read alike."""
    for unit, scale in _EXACT_UNITS:
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def fmt_bytes(count: int) -> str:
    """A count in the largest unit it reaches, one decimal ("1.5 GiB"): a measured
    amount, where the exact figure matters less than its size."""
    for unit, size in _BYTE_UNITS:
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def number(value: object) -> float | None:
    """A finite int or float (not a bool), else None: a record is read defensively."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
