"""bench's consistency check is exact where it can be (issue 23): ranks of one GPU model
and software stack compute bit-identical logits, so one ulp off is caught; the CPU
reference and ranks of different stacks keep their tolerance."""

from __future__ import annotations

import torch

from gpucheck.bench.consistency import compare_outputs, reference_tolerance
from gpucheck.bench.findings import consistency_section
from gpucheck.bench.records import RankRecord
from gpucheck.report import Status

H100 = "NVIDIA H100 80GB HBM3, 132 SMs, torch 2.14.1, CUDA 13.2, cuDNN 91000"
A100 = "NVIDIA A100-SXM4-80GB, 108 SMs, torch 2.14.1, CUDA 13.2, cuDNN 91000"


def record(rank: int) -> RankRecord:
    return RankRecord(
        rank=rank, host="node0", node_rank=0, local_rank=rank, device=f"cuda:{rank}",
        device_name="NVIDIA H100", device_uuid=f"GPU-{rank}", images=64, iters=8,
        wall_s=1.0, span_s=1.0, device_s=0.9, peak_memory_bytes=None, threads=1,
        iter_ms=(125.0,) * 8, stack=H100)


def logits() -> torch.Tensor:
    return torch.randn(4, 1000, generator=torch.Generator().manual_seed(7))


def one_ulp_off(values: torch.Tensor) -> torch.Tensor:
    """`values` with one element moved to the next float32 towards +inf."""
    moved = values.clone()
    moved[2, 17] = torch.nextafter(moved[2, 17], torch.tensor(float("inf")))
    assert not torch.equal(moved, values)
    return moved


def statuses(n: int, result: object) -> list[tuple[Status, str | None]]:
    section = consistency_section(tuple(record(r) for r in range(n)), result, "bf16")
    return [(f.status, f.subject and f.subject.label) for f in section.findings]


def test_one_ulp_off_the_other_ranks_of_its_stack_is_a_wrong_rank() -> None:
    truth = logits()
    outputs = [truth, truth.clone(), one_ulp_off(truth)]
    result = compare_outputs(outputs, "bf16", truth, reference_tolerance("bf16", "cuda"),
                             stacks=[H100] * 3)
    assert tuple(result.wrong) == (2,)
    assert "bitwise" in result.wrong[2]
    assert statuses(3, result) == [(Status.FAIL, "rank 2")]
    assert result.bitwise_groups == {H100: (0, 1, 2)}


def test_two_ranks_of_one_stack_one_ulp_apart_are_named_together() -> None:
    truth = logits()
    result = compare_outputs([truth, one_ulp_off(truth)], "bf16", truth,
                             reference_tolerance("bf16", "cuda"), stacks=[H100, H100])
    assert tuple(result.wrong) == () and result.bitwise_split == (0, 1)
    assert statuses(2, result) == [(Status.WARN, "rank 0, rank 1")]


def test_bit_identical_ranks_of_one_stack_agree() -> None:
    truth = logits()
    result = compare_outputs([truth, truth.clone()], "bf16", truth,
                             reference_tolerance("bf16", "cuda"), stacks=[H100, H100])
    assert statuses(2, result) == [(Status.OK, None)]


def test_ranks_of_different_stacks_keep_the_tolerance() -> None:
    # Another GPU model runs other kernels: its rounding differs, within the tolerance.
    truth = logits()
    close = truth + 1e-4 * truth.abs().max()
    result = compare_outputs([truth, truth.clone(), close], "bf16", truth,
                             reference_tolerance("bf16", "cuda"), stacks=[H100, H100, A100])
    assert tuple(result.wrong) == () and result.bitwise_split == ()
    assert statuses(3, result) == [(Status.OK, None)]


def test_cpu_ranks_and_the_cpu_reference_keep_their_tolerances() -> None:
    truth = logits()
    result = compare_outputs([truth, one_ulp_off(truth)], "fp32", truth)
    assert tuple(result.wrong) == () and result.undecided == () and result.bitwise_split == ()
    assert result.bitwise_groups == {}
    far = compare_outputs([truth, truth * 1.01], "fp32", truth)
    assert tuple(far.wrong) == (1,) and "CPU reference" in far.wrong[1]
