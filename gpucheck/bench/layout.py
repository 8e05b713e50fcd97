"""CPU ranks re-place their model and batch in fresh memory between segments of the
timed loop.

Why: where a process's tensors happen to land (which pages, which cache sets; invisible
from inside a VM) makes its computation faster or slower by up to about 10%, and the
offset holds for as long as the tensors stay where they are. Two identical CPU
processes taking turns on the same cores, their tensors left in place, ran 7% to 11%
apart in every quarter of the loop in 3 of 10 runs on the 2-core development VM (1.06
at worst in 8 runs of benchmarks/cpu_placement.py, another day); with the weights and
the batch copied to fresh memory every quarter, each quarter drew its own offset and
the loop's median stayed within 2% in those 10 runs (1.039 at worst in the 8). A rank
that computes more stays slower whatever memory it gets, so the verdict keeps seeing a
real straggler (docs/bench.md, "Stragglers").

The copy is made between segments, outside the timed windows, and every segment
starts at a common barrier, so the ranks stay lined up in time. GPU ranks run one
segment: their tensors live in the GPU's memory and CUDA events time the GPU.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Three iterations a segment: the default CPU loop (12 iterations) gets four
# placements; a median over fewer segments is moved by one unlucky placement.
ITERS_PER_SEGMENT = 3
# Each re-placement costs a copy of the weights and a barrier (the copy about 11 ms for
# ResNet50 on one core here), outside the timed windows but inside the run: a long
# --duration run does not need more placements than this to even out.
MAX_SEGMENTS = 8


def segment_sizes(iters: int, relayout: bool) -> tuple[int, ...]:
    """How many iterations each segment of the timed loop runs: one segment unless
    `relayout`, else about ITERS_PER_SEGMENT each (at most MAX_SEGMENTS), the larger
    ones first."""
    if not relayout or iters < 2 * ITERS_PER_SEGMENT:
        return (iters,)
    count = min(MAX_SEGMENTS, iters // ITERS_PER_SEGMENT)
    base, extra = divmod(iters, count)
    return tuple(base + 1 if i < extra else base for i in range(count))


def relayout(module: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Copy every parameter and buffer of `module` into fresh memory in place (the
    module, and DDP's references to its tensors, stay the same objects; the old memory is
    freed) and return a fresh copy of `batch`."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            tensor.data = tensor.data.clone()
        return batch.clone()
