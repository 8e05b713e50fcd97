"""Does every rank compute the right answer? The logits of one fixed batch against a
float32 CPU reference, the ranks' median, and bit for bit within one GPU model and
software stack, judged by `gpucheck.agreement.judge` (docs/bench.md, "The CPU
reference"). Deviation is relative: max |logits - reference| / max |reference|."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpucheck.agreement import Judgement, beyond, judge, relative_deviation

if TYPE_CHECKING:
    import torch

    from gpucheck.bench.model import WeightsChoice

# Relative tolerance per dtype: above the rounding of other kernels and GPU models, below
# a faulty GPU's. "tf32": fp32 on a GPU, whose convolutions cuDNN runs in TF32 by default.
TOLERANCE = {"fp32": 1e-3, "tf32": 2e-2, "fp16": 2e-2, "bf16": 5e-2}
AGREE = "agrees with the ranks' median"
# Settings that change which kernels cuBLAS and torch pick: ranks that differ in them
# may round differently, so they are no bitwise group.
_KERNEL_SETTINGS = ("CUBLAS_WORKSPACE_CONFIG", "TORCH_BLAS_PREFER_CUBLASLT",
                    "NVIDIA_TF32_OVERRIDE")


@dataclass(frozen=True)
class Consistency:
    """How far each rank's logits are from the CPU reference and from the other ranks."""

    images: int
    tolerance: float  # between ranks
    deviations: tuple[float, ...]  # per rank, from the ranks' median; inf when not finite
    nonfinite_ranks: tuple[int, ...]
    wrong: dict[int, str] = field(default_factory=dict)  # rank -> why
    undecided: tuple[int, ...] = ()  # disagree, and nothing tells which one is right
    reference_deviations: tuple[float, ...] | None = None  # None: no reference computed
    reference_tolerance: float | None = None
    # Ranks compared bit for bit: stack -> its ranks; and the ranks of one stack whose
    # logits differ bitwise with no majority to tell which is right.
    bitwise_groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bitwise_split: tuple[int, ...] = ()

    @property
    def max_deviation(self) -> float:
        return max(self.deviations)


def reference_tolerance(dtype: str, device: str) -> float:
    return TOLERANCE["tf32" if dtype == "fp32" and device == "cuda" else dtype]


def software_stack(device_index: int) -> str | None:
    """The GPU model and software whose ranks must compute bit-identical logits; None
    when cuDNN autotunes (ranks may pick other kernels)."""
    import torch

    if torch.backends.cudnn.benchmark:
        return None
    props = torch.cuda.get_device_properties(device_index)
    settings = "".join(f", {name}={os.environ[name]}" for name in _KERNEL_SETTINGS
                       if name in os.environ)
    return (f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}{settings}")


def compare_outputs(outputs: Sequence[torch.Tensor], dtype: str,
                    reference: torch.Tensor | None = None,
                    ref_tolerance: float | None = None,
                    stacks: Sequence[str | None] = ()) -> Consistency:
    """`outputs[r]`: rank r's float32 logits for the fixed batch; `reference`: the CPU's
    (`ref_tolerance`, default the dtype's); `stacks[r]`: rank r's `software_stack`."""
    import torch

    stacked = torch.stack([o.float().cpu() for o in outputs])
    finite = [bool(torch.isfinite(o).all()) for o in stacked]
    usable = stacked[torch.tensor(finite)] if any(finite) else stacked
    median = usable.quantile(0.5, dim=0) if len(usable) > 1 else usable[0]
    scale = max(float(median.abs().max()), 1e-12)
    deviations = tuple(float((o - median).abs().max()) / scale if ok else float("inf")
                       for o, ok in zip(stacked, finite, strict=True))
    tolerance = TOLERANCE[dtype]
    ref_tol = ref_tolerance if ref_tolerance is not None else tolerance
    ref_devs = None if reference is None else tuple(
        relative_deviation(o, reference.to(torch.float64)) for o in stacked)
    # The median of the ranks votes like a digest: ranks within tolerance of it share
    # one label, each stray rank has its own. A non-finite rank is wrong even without
    # a reference (an infinite deviation is always beyond it).
    labels = {r: AGREE if not beyond(d, tolerance) else f"rank {r}"
              for r, d in enumerate(deviations)}
    against = dict(enumerate(ref_devs)) if ref_devs is not None else {
        r: float("inf") for r, ok in enumerate(finite) if not ok}
    verdict = judge(labels, against, ref_tol)
    groups = {r: stack for r, stack in enumerate(stacks) if stack and r < len(outputs)}
    exact = judge({r: _digest(stacked[r]) for r in groups}, against, ref_tol, groups)
    wrong = {r: _reason(r, against, ref_tol, deviations[r], tolerance)
             for r in verdict.wrong}
    wrong |= {r: _bitwise_reason(r, exact, groups) for r in exact.wrong if r not in wrong}
    return Consistency(
        images=int(stacked.shape[1]), tolerance=tolerance, deviations=deviations,
        nonfinite_ranks=tuple(r for r, ok in enumerate(finite) if not ok),
        wrong=dict(sorted(wrong.items())),
        undecided=tuple(sorted(set(verdict.undecided) - wrong.keys())),
        reference_deviations=ref_devs,
        reference_tolerance=ref_tol if ref_devs is not None else None,
        bitwise_groups={stack: tuple(r for r in groups if groups[r] == stack)
                        for stack in sorted(set(groups.values()))},
        bitwise_split=tuple(r for r in exact.undecided
                            if r not in wrong and r not in verdict.undecided),
    )


def _digest(logits: torch.Tensor) -> str:
    """The exact bits of a rank's logits (float32: the dtype's values widened exactly)."""
    return hashlib.sha256(logits.contiguous().numpy().tobytes()).hexdigest()


def _bitwise_reason(rank: int, exact: Judgement, groups: dict[int, str]) -> str:
    agree = sum(1 for r in groups if groups[r] == groups[rank] and r not in exact.wrong)
    return (f"computed logits that differ bitwise from the {agree} other rank(s) of the "
            f"same GPU model and software stack, which agree bit for bit ({groups[rank]})")


def _reason(rank: int, against: dict[int, float], ref_tol: float, deviation: float,
            tolerance: float) -> str:
    """Why `rank` is wrong, in bench's terms (here ranks agree within a tolerance)."""
    if deviation == float("inf"):
        return "computed non-finite logits"
    if beyond(against.get(rank), ref_tol):
        return (f"computed logits {against[rank]:.3g} away from the CPU reference "
                f"(tolerance {ref_tol:g})")
    return (f"computed logits {deviation:.3g} away from the median of the ranks, which "
            f"the others agree with (tolerance {tolerance:g})")


def cpu_reference(model: str, weights: WeightsChoice, dtype: str, images_dir: str,
                  files: Sequence[str]) -> torch.Tensor:
    """The check batch's logits on the CPU in float32, weights and images first rounded
    to the run's dtype as the ranks had them."""
    import torch

    from gpucheck.bench import model as bench_model

    low = bench_model.torch_dtype(dtype)
    net = bench_model.build_model(model, weights).to(low).float()
    batch = bench_model.load_tensor(images_dir, tuple(files)).to(low).float()
    with torch.inference_mode():
        logits: torch.Tensor = net(batch.contiguous(memory_format=torch.channels_last))
    return logits
