"""Silent data corruption under load (gpu-burn's method) on one device: the burn-in, its
row checks and digests, the fp64 CPU reference with each element's bound, and the cuBLAS
that decides which ranks must agree bit for bit (docs/stress.md)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucheck.distributed.deadline import synchronize
from gpucheck.probes.torch_build import MAPS, already_loaded, mapped_paths
from gpucheck.stats import percentile
from gpucheck.stress.gemm import matmul_precision, seeded_pair
from gpucheck.stress.records import BurnRecord as BurnRecord  # its home: records.py
from gpucheck.timing import Marks

if TYPE_CHECKING:
    import torch


SDC_SEED = 20260
CHUNK_S = 0.5  # a synchronisation this often (the clock is read every product)
MIN_REPEATS = 10  # however short the duration: fewer repetitions prove nothing
FULL_REFERENCE_MAX = 1024  # up to this n, the CPU reference covers the whole product
# Otherwise one row drawn from every band of TILE_ROWS rows: no higher than cuBLAS's
# lowest GEMM tile, so every tile has a row checked ...
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


def _first_result(a: torch.Tensor, b: torch.Tensor,
                  kind: str) -> tuple[torch.Tensor, str, float]:
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
         group: str) -> tuple[BurnRecord, torch.Tensor, torch.Tensor]:
    """Repeat the product for `duration_s`; (the record, the first result, its row
    checks)."""
    import torch

    with torch.inference_mode(), matmul_precision(dtype), full_precision_reductions():
        a, b = seeded_pair(n, SDC_SEED, device, dtype, on_cpu=True)
        golden, mode, per_iter = _first_result(a, b, kind)
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


def reference_and_bounds(n: int, dtype: str, rows: list[int],
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the product's `rows` in fp64 on the CPU, each element's allowed error): the
    same seeded inputs rounded to the dtype; the bound is OUTPUT_ROUNDING x |r| +
    ACCUMULATION x (|A| |B|) (gpucheck.stress.burn)."""
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


# Largest |result - fp64 reference| / largest |reference| a healthy GPU stays under
# (the tolerance mode and bench's consistency check; docs/stress.md).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 2e-2}

# Each element's bound against the fp64 reference: |c - r| <= OUTPUT_ROUNDING x |r| +
# ACCUMULATION x (|A| |B|); docs/stress.md gives each dtype's figures and why.
OUTPUT_ROUNDING = {"fp32": 2.0 ** -22, "tf32": 2.0 ** -22, "fp16": 2.0 ** -9,
                   "bf16": 2.0 ** -6}
ACCUMULATION = {"fp32": 2.0 ** -16, "tf32": 2.0 ** -11, "fp16": 2.0 ** -13,
                "bf16": 2.0 ** -13}
BOUND_TOLERANCE = 1.0  # a deviation is |c - r| / bound: above 1 is beyond the bound


def bound_excess(values: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor) -> float:
    """max over the elements of |values - reference| / bound: 1 is at the bound (inf
    when `values` is not finite)."""
    import torch

    got = values.to(torch.float64)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    return float(((got - reference).abs() / bound).max())


_PROPERTIES = (0, 1, 2)  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
CUBLAS, CUBLASLT = re.compile(r"^libcublas\.so"), re.compile(r"^libcublasLt\.so")
# Environment variables read by cuBLAS or torch that change the kernel choice; their
# values are shown (CUBLAS_ and TORCH_ are on gpucheck.probes.system' allowlist).
SETTINGS_VARS = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                 "TORCH_BLAS_PREFER_CUBLASLT")


@dataclass(frozen=True)
class Blas:
    """What decides the GEMM kernels beyond the GPU model: versions and settings."""

    cublas: str | None  # "13.1.1" read from the loaded library, None when unknown
    cublaslt: str | None  # cublasLtGetVersion(), e.g. "130101"
    path: str | None  # the libcublas file mapped in this process
    why_unknown: str | None  # why `cublas` is None
    settings: tuple[tuple[str, str], ...]  # (name, value) of what was set

    def key(self) -> str:
        """The part of a kernel group that these make (stable text, sorted settings)."""
        version = f"cuBLAS {self.cublas}" if self.cublas else "cuBLAS unknown"
        if self.cublaslt:
            version += f" (Lt {self.cublaslt})"
        return ", ".join([version, *(f"{k}={v}" for k, v in self.settings)])


def library_version(path: str, loader: Callable[[str], Any] = already_loaded,
                    ) -> tuple[str | None, str | None]:
    """(major.minor.patch, None) from `cublasGetProperty`, or (None, why)."""
    try:
        lib = loader(path)
    except OSError as exc:
        return None, f"could not open {os.path.basename(path)}: {exc}"
    function = getattr(lib, "cublasGetProperty", None)
    if function is None:
        return None, f"{os.path.basename(path)} has no cublasGetProperty"
    parts = []
    for prop in _PROPERTIES:
        value = ctypes.c_int(-1)
        status = function(prop, ctypes.byref(value))
        if status != 0:
            return None, f"cublasGetProperty({prop}) returned status {status}"
        parts.append(str(value.value))
    return ".".join(parts), None


def lt_version(path: str | None, loader: Callable[[str], Any] = already_loaded,
               ) -> str | None:
    """cublasLtGetVersion() of the mapped libcublasLt, or None."""
    if path is None:
        return None
    try:
        function = getattr(loader(path), "cublasLtGetVersion", None)
    except OSError:
        return None
    if function is None:
        return None
    function.restype = ctypes.c_size_t
    return str(function())


def torch_settings(torch: Any) -> list[tuple[str, str]]:
    """torch's own choices: the preferred BLAS library and the workspace sizes (these
    functions are private; a torch without one shows that it was not read)."""
    found = []
    prefer = getattr(torch.backends.cuda, "preferred_blas_library", None)
    found.append(("torch blas", str(prefer()).rsplit(".", 1)[-1] if prefer else "not read"))
    for name, label in (("_cuda_getCublasWorkspaceSize", "workspace bytes"),
                        ("_cuda_getCublasLtWorkspaceSize", "Lt workspace bytes")):
        getter = getattr(torch._C, name, None)
        found.append((label, _read(getter) if getter is not None else "not read"))
    return found


def _read(getter: Callable[[], Any]) -> str:
    """A torch getter's answer; its error's first words when CUDA refuses (a broken
    driver is the fault watch's and env's to report, not a reason to stop here)."""
    try:
        return str(getter())
    except RuntimeError as exc:  # a message may be empty: its type then
        words = str(exc).strip().splitlines() or [type(exc).__name__]
        return f"not read ({words[0][:80]})"


def loaded_blas(torch: Any | None = None, environ: dict[str, str] | None = None,
                maps: Path = MAPS) -> Blas:
    """The cuBLAS mapped in this process and the settings in force (call after the
    first product on the GPU: torch loads cuBLAS and sizes its workspace lazily)."""
    env = os.environ if environ is None else environ
    settings = [(name, env[name]) for name in SETTINGS_VARS if name in env]
    if torch is not None:
        settings += torch_settings(torch)
    paths, lt = mapped_paths(CUBLAS, maps), mapped_paths(CUBLASLT, maps)
    if not paths:
        return Blas(None, None, None, "no libcublas is mapped in this process",
                    tuple(settings))
    version, why = library_version(paths[0])
    return Blas(version, lt_version(lt[0] if lt else None), paths[0], why, tuple(settings))
