"""Option values shared by compare and fleet, checked with a one-line UsageError."""

from __future__ import annotations

import math

from gpucheck.errors import UsageError


def fraction(text: str, option: str) -> float:
    """"0.05" or "5%" as 0.05; it must lie strictly between 0 and 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a number: give a fraction (0.05) or a "
                         "percentage (5%)") from None
    if not 0 < value < 1:
        raise UsageError(f"{option} {text!r} must lie between 0 and 1 (0% and 100%), e.g. "
                         "0.05 or 5%")
    return value


def positive(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number, not {value}")
    return value
