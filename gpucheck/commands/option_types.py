"""argparse types for numeric options: finite, in range, or a one-line usage error.

`float("nan")`, `float("inf")` and `-1` are valid Python numbers, so `type=float`
let `--timeout nan`, `--duration inf` or `--nvml-timeout inf` through to the run,
where they failed as a rank crash or a "report a gpucheck bug" (a NaN compares False
with everything, so `timeout <= 0` checks never fired). Every numeric option of every
command uses one of these types; argparse turns the ArgumentTypeError into the
parser's one-line error and exit 2 (gpucheck.commands.registry.OneLineParser).
"""

from __future__ import annotations

import argparse
import math

# Counts (iterations, ranks, sizes): beyond 2**40 nothing finishes; a number that big
# is a typo, and a huge int would reach range() or a semaphore count as it is.
MAX_COUNT = 2**40


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: not a finite number")
    return value


def finite_float(text: str) -> float:
    """A finite number, for options whose command checks the range itself (a
    fraction in (0, 1]) and says so in its own words."""
    return _number(text)


def positive_float(text: str) -> float:
    """A finite number greater than 0 (seconds, fractions, GB/s, factors)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number greater than 0")
    return value


# Longer than any run: beyond it a thread's timeout overflows (--budget 1e10 was a
# traceback) or a deadline lands past every clock (1e20: a false rank failure).
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(text: str) -> float:
    """A duration greater than 0 and at most MAX_SECONDS (a week)."""
    value = positive_float(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text}: too long (at most {MAX_SECONDS:g} s, "
                                         "a week)")
    return value


def _integer(text: str) -> int:
    raw = text.strip()
    if not (raw.lstrip("+-").isascii() and raw.lstrip("+-").isdigit()) or len(raw) > 16:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number (up to "
                                         f"{MAX_COUNT})")
    value = int(raw)
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text}: too large (at most {MAX_COUNT})")
    return value


def integer(text: str) -> int:
    """A whole number within MAX_COUNT either way, for options whose command checks
    the range itself and says so in its own words."""
    value = _integer(text)
    if value < -MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text}: too small (at least {-MAX_COUNT})")
    return value


def positive_int(text: str) -> int:
    """A whole number, 1 or more (iterations, ranks, sizes, nodes)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more")
    return value


def non_negative_int(text: str) -> int:
    """A whole number, 0 or more (warm-up iterations)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: give 0 or more")
    return value


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    value = _integer(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text}: not a TCP port; use 1024-65535")
    return value
