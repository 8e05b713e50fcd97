"""Does every rank compute the same answer? Compare the logits of one fixed batch.

Every rank runs the same images through the same weights (DDP broadcast rank 0's
parameters at construction), so the logits should agree up to the rounding of
the dtype. The reference is the element-wise median over ranks, so with three
or more ranks one wrong GPU stands out; with two ranks a disagreement names both.
Deviation is relative: max |logits - reference| / max |reference|.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Relative tolerance per dtype: well above the rounding of different kernels on
# different GPU models, well below what a faulty GPU produces.
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}


@dataclass(frozen=True)
class Consistency:
    """How far each rank's logits are from the ranks' consensus."""

    images: int
    tolerance: float
    deviations: tuple[float, ...]  # per rank; inf when its logits are not finite
    bad_ranks: tuple[int, ...]
    nonfinite_ranks: tuple[int, ...]

    @property
    def max_deviation(self) -> float:
        return max(self.deviations)


def compare_outputs(outputs: Sequence[torch.Tensor], dtype: str) -> Consistency:
    """`outputs[r]` is rank r's float32 logits for the same fixed batch."""
    import torch

    stacked = torch.stack([o.float().cpu() for o in outputs])
    finite = [bool(torch.isfinite(o).all()) for o in stacked]
    usable = stacked[torch.tensor(finite)] if any(finite) else stacked
    reference = usable.quantile(0.5, dim=0) if len(usable) > 1 else usable[0]
    scale = max(float(reference.abs().max()), 1e-12)
    deviations = tuple(
        float((o - reference).abs().max()) / scale if ok else float("inf")
        for o, ok in zip(stacked, finite, strict=True)
    )
    tolerance = TOLERANCE[dtype]
    return Consistency(
        images=int(stacked.shape[1]),
        tolerance=tolerance,
        deviations=deviations,
        bad_ranks=tuple(r for r, d in enumerate(deviations) if d > tolerance),
        nonfinite_ranks=tuple(r for r, ok in enumerate(finite) if not ok),
    )
