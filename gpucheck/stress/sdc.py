"""Which rank computed a wrong result? The burn-in's tolerances and deviations. The
vote over per-rank digests and a reference (groups, majority, undecided ranks, software
splits) is `gpucheck.agreement`, torch-free and shared with bench's consistency check:
its docstring says how a rank is judged wrong and when a split is software."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

# The vote itself is torch-free and shared with bench (gpucheck.agreement); these
# names stay importable from here for the stress report.
from gpucheck.agreement import (
    Judgement,
    beyond,
    judge,
    odd_by_majority,
    relative_deviation,
    software_splits,
)

if TYPE_CHECKING:
    import torch

# Largest |result - fp64 reference| / largest |reference| a healthy GPU stays under.
# Inputs are rounded to the dtype on both sides, so this is accumulation order
# (fp32 accumulators) plus the output's rounding: bf16 keeps 8 bits (0.4% of the
# value), fp16 11, TF32 rounds the inputs' mantissas to 10 bits (~5e-4 relative).
# Each tolerance is several times that; a flipped exponent or sign bit, or a wrong
# tile, is far beyond it.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 2e-2}

# The burn-in's per-element bound against the fp64 reference (`element_bounds`):
#   |c_ij - r_ij| <= OUTPUT_ROUNDING * |r_ij| + ACCUMULATION * (|A| |B|)_ij
# the classic error bound of a dot product (Higham, "Accuracy and Stability of
# Numerical Algorithms", 2nd ed., section 3.1: |error| <= gamma_k |a|.|b|), with the
# output's rounding apart. OUTPUT_ROUNDING is 4x the unit roundoff of the output type
# (2^-24 fp32, 2^-11 fp16, 2^-8 bf16). ACCUMULATION: fp32 accumulators whose rounding
# errors mostly cancel give about u x (|A||B|)_ij (u = 2^-24); 2^-16 leaves a margin of
# hundreds. Tensor cores may truncate when they align products (Fasi, Higham, Mikaitis,
# Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021), an error that
# grows like sqrt(k) u: 2^-13 for fp16/bf16 inputs covers k = 65536 at 2^-23 several
# times over. TF32 rounds the inputs to 10 mantissa bits, which the fp32 reference does
# not: each product's error is below 2^-10 of it, so 2^-11 on |A||B| (random signs
# cancel most) is some 10x the largest deviation of random inputs. With bf16 at
# n = 8192 (|A||B| about 5,200) an element may be off by about 0.6 + 1.6 % of itself:
# the sign of every element above about 0.3 is checked, where a bound scaled by the
# largest reference value let about 8 through.
OUTPUT_ROUNDING = {"fp32": 2.0 ** -22, "tf32": 2.0 ** -22, "fp16": 2.0 ** -9,
                   "bf16": 2.0 ** -6}
ACCUMULATION = {"fp32": 2.0 ** -16, "tf32": 2.0 ** -11, "fp16": 2.0 ** -13,
                "bf16": 2.0 ** -13}
BOUND_TOLERANCE = 1.0  # a deviation is |c - r| / bound: above 1 is beyond the bound
BOUND_WORDS = "is {:.3g}x its per-element bound from the fp64 CPU reference (at most {:g})"

__all__ = ["ACCUMULATION", "BOUND_TOLERANCE", "BOUND_WORDS", "OUTPUT_ROUNDING", "TOLERANCE",
           "Judgement", "beyond", "bound_excess", "judge", "odd_by_majority",
           "relative_deviation", "software_splits"]


def bound_excess(values: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor) -> float:
    """max over the elements of |values - reference| / bound: 1 is at the bound (inf
    when `values` is not finite)."""
    import torch

    got = values.to(torch.float64)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    return float(((got - reference).abs() / bound).max())
