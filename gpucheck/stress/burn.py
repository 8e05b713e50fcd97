"""Silent data corruption under load (gpu-burn's method), on one device.

Every rank multiplies the same seeded inputs (drawn on the CPU, so bit-identical on
every rank) over and over for the run's duration and compares every result with
its first one. cuBLAS is bitwise reproducible run to run on the same GPU with the
same kernel, so on a GPU the comparison is exact (tolerance zero). That is checked
first: two products are compared before the first result is taken; if they differ
(a non-deterministic kernel), the loop compares within the dtype's tolerance
instead and says so (mode "tolerance").

The first result is also summarised for the cross-rank comparison: per row, the sum
of its elements' bit patterns and the sum weighted by column (int64, exact), whose
hash is the rank's digest; rows where ranks differ are located from them without
moving the matrix.

Against the fp64 CPU reference (what names a GPU that is wrong the same way every
time, even alone), a product larger than FULL_REFERENCE_MAX is checked on one row
drawn per run from every band of TILE_ROWS rows, so every output tile (and the SM
that computed it) has a row checked, each element within its own bound
(`gpucheck.stress.sdc.OUTPUT_ROUNDING` / `ACCUMULATION`), plus rows where ranks
disagree. A different draw each run reaches other rows over time.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpucheck.distributed.deadline import synchronize
from gpucheck.stats import percentile
from gpucheck.stress.gemm import matmul_precision, seeded_pair
from gpucheck.stress.hooks import Hook
from gpucheck.stress.records import BurnRecord as BurnRecord  # its home: records.py
from gpucheck.stress.sdc import ACCUMULATION, OUTPUT_ROUNDING, TOLERANCE
from gpucheck.timing import Marks

if TYPE_CHECKING:
    import torch

SDC_SEED = 20260
CHUNK_S = 0.5  # a synchronisation this often (the clock is read every product)
MIN_REPEATS = 10  # however short the duration: fewer repetitions prove nothing
FULL_REFERENCE_MAX = 1024  # up to this n, the CPU reference covers the whole product
# Otherwise one row drawn from every band of TILE_ROWS rows: cuBLAS's GEMM tiles are
# 64 to 256 rows high (CUTLASS/cuBLAS threadblock tiles; Hopper's 64xN kernels the
# lowest), so a band no higher than the lowest tile gives each tile at least one row
# checked, on every column (bands of 128 left half of the 64-row tiles unchecked) ...
TILE_ROWS = 64
EXTRA_ROWS = 8  # ... plus up to this many rows where the ranks disagree


def _bits(out: torch.Tensor) -> torch.Tensor:
    import torch

    return out.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()])


def row_checks(out: torch.Tensor) -> torch.Tensor:
    """(n, 2) int64 on the CPU: per row, the sum of the bit patterns and the sum
    weighted by column. Any single changed element changes its row's sums."""
    import torch

    bits = _bits(out)
    weights = torch.arange(1, bits.shape[1] + 1, device=out.device, dtype=torch.int64)
    block = max(1, (128 << 20) // (bits.shape[1] * 8))  # bound the int64 temporaries
    parts = []
    for start in range(0, bits.shape[0], block):
        chunk = bits[start:start + block].to(torch.int64)
        parts.append(torch.stack((chunk.sum(1), (chunk * weights).sum(1)), dim=1))
    return torch.cat(parts).cpu()


def digest_of(checks: torch.Tensor) -> str:
    return hashlib.blake2b(repr(checks.tolist()).encode(), digest_size=8).hexdigest()


def _mismatch_counter(golden: torch.Tensor, mode: str, dtype: str) -> Any:
    """A function out -> 0-dim tensor: wrong elements (bitwise) or 1/0 (tolerance)."""
    import torch

    if mode == "bitwise":
        ref_bits = _bits(golden)
        return lambda out: torch.count_nonzero(_bits(out) != ref_bits)
    limit = TOLERANCE[dtype] * float(golden.float().abs().max())
    return lambda out: ((out.float() - golden.float()).abs().max() > limit).to(torch.int64)


def _first_result(a: torch.Tensor, b: torch.Tensor, kind: str,
                  hook: Hook | None) -> tuple[torch.Tensor, str, float]:
    """(the first result, the comparison mode, seconds per product)."""
    import torch

    first, second = torch.matmul(a, b), torch.empty_like(a)
    synchronize(kind)
    started = time.perf_counter()
    torch.matmul(a, b, out=second)
    synchronize(kind)
    per_iter = time.perf_counter() - started
    mode = "bitwise" if torch.equal(_bits(first), _bits(second)) else "tolerance"
    torch.matmul(a, b, out=first)
    if hook is not None:
        hook("burn", 0, first)
    return first, mode, per_iter


@contextlib.contextmanager
def full_precision_reductions() -> Iterator[None]:
    """fp16/bf16 products may reduce split-K partial sums in fp16/bf16 by default
    (cuBLAS's faster kernels); for the burn-in keep fp32 reductions, so the distance
    to the fp64 reference is the output's rounding, far inside the tolerance."""
    import torch

    matmul = torch.backends.cuda.matmul
    before = (matmul.allow_fp16_reduced_precision_reduction,
              matmul.allow_bf16_reduced_precision_reduction)
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (matmul.allow_fp16_reduced_precision_reduction,
         matmul.allow_bf16_reduced_precision_reduction) = before


def burn(rank: int, dtype: str, n: int, device: Any, kind: str, duration_s: float,
         group: str, hook: Hook | None) -> tuple[BurnRecord, torch.Tensor, torch.Tensor]:
    """Repeat the product for `duration_s`; (the record, the first result, its row
    checks)."""
    import torch

    with torch.inference_mode(), matmul_precision(dtype), full_precision_reductions():
        a, b = seeded_pair(n, SDC_SEED, device, dtype, on_cpu=True)
        golden, mode, per_iter = _first_result(a, b, kind, hook)
        count = _mismatch_counter(golden, mode, dtype)
        out = torch.empty_like(golden)
        chunk = max(1, min(1000, round(CHUNK_S / max(per_iter, 1e-6))))
        times: list[float] = []
        wrong: list[int] = []
        deadline = time.monotonic() + duration_s
        started = time.perf_counter()
        while len(times) < MIN_REPEATS or time.monotonic() < deadline:
            marks = Marks(kind)
            counts: list[torch.Tensor] = []  # per product: its wrong rows, on the device
            marks.mark()
            for _ in range(chunk):
                torch.matmul(a, b, out=out)
                if hook is not None:
                    hook("burn", len(times) + len(counts) + 1, out)
                counts.append(count(out))
                marks.mark()
                # The chunk is sized from the first product: a GPU that slows down later
                # (or a planted sleep) would otherwise overrun the duration by a chunk.
                if time.monotonic() >= deadline and len(times) + len(counts) >= MIN_REPEATS:
                    break
            times += marks.intervals_s()
            wrong += [int(c) for c in torch.stack(counts).tolist()]
        elapsed = time.perf_counter() - started
        checks = row_checks(golden)
    record = _record(rank, dtype, n, mode, times, wrong, elapsed, digest_of(checks), group)
    return record, golden, checks


def _record(rank: int, dtype: str, n: int, mode: str, times: list[float],
            wrong: list[int], elapsed: float, digest: str, group: str) -> BurnRecord:
    bad = [i + 1 for i, w in enumerate(wrong) if w]
    return BurnRecord(rank=rank, dtype=dtype, size=n, mode=mode, iters=len(times),
                      duration_s=elapsed, bad_iters=len(bad),
                      first_bad_iter=bad[0] if bad else None,
                      worst_elements=max(wrong) if mode == "bitwise" and wrong else 0,
                      p50_ms=percentile(times, 50) * 1e3, p99_ms=percentile(times, 99) * 1e3,
                      digest=digest, group=group)


def draw_seed() -> int:
    """This run's draw of reference rows (rank 0's is used by every rank)."""
    return secrets.randbits(32)


def rows_to_check(n: int, checks: list[torch.Tensor], seed: int = 0) -> list[int]:
    """The rows the CPU reference covers: all of a small product; else one row drawn
    (with `seed`) from each band of TILE_ROWS rows, plus up to EXTRA_ROWS where the
    ranks' row checks disagree."""
    import torch

    if n <= FULL_REFERENCE_MAX:
        return list(range(n))
    draw = random.Random(seed)
    drawn = [draw.randrange(start, min(start + TILE_ROWS, n)) for start in range(0, n, TILE_ROWS)]
    stacked = torch.stack(checks)
    differ = (stacked != stacked[0]).any(dim=2).any(dim=0)
    extra = [int(r) for r in torch.nonzero(differ).flatten().tolist() if r not in drawn]
    return sorted(drawn + extra[:EXTRA_ROWS])


def coverage(n: int, rows: list[int]) -> str:
    """How much of the product the reference checked, for the OK and the data."""
    if len(rows) >= n:
        return f"all {n} rows ({n * n} elements)"
    return (f"{len(rows)} of {n} rows ({100 * len(rows) / n:.2g}% of the {n * n} "
            f"elements; one drawn per {TILE_ROWS}-row band, so every output tile)")


def reference_rows(n: int, dtype: str, rows: list[int]) -> torch.Tensor:
    """The product's `rows` in fp64 on the CPU, from the same seeded inputs rounded to
    the dtype (TF32's input rounding is left to the tolerance)."""
    return reference_and_bounds(n, dtype, rows)[0]


def reference_and_bounds(n: int, dtype: str, rows: list[int],
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the product's `rows` in fp64 on the CPU, each element's allowed error): the
    same seeded inputs rounded to the dtype; the bound is OUTPUT_ROUNDING x |r| +
    ACCUMULATION x (|A| |B|) (gpucheck.stress.sdc)."""
    import torch

    from gpucheck.stress.gemm import torch_dtype

    a, b = seeded_pair(n, SDC_SEED, "cpu", "fp32", on_cpu=True)
    kind = torch_dtype(dtype)
    index = torch.tensor(rows, dtype=torch.long)
    left, right = a[index].to(kind).double(), b.to(kind).double()
    del a, b
    reference = left @ right
    magnitude = left.abs_() @ right.abs_()
    bound = OUTPUT_ROUNDING[dtype] * reference.abs() + ACCUMULATION[dtype] * magnitude
    return reference, bound.clamp_(min=1e-300)
