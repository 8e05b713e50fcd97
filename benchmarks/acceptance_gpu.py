"""What only a GPU can settle, for benchmarks/gpu_acceptance.py (its helper module).

- Clock-reason masks and SM clocks sampled on every GPU while gpucheck stress and comm
  run (`ClockSampler`, `clock_summary`): how often the HW-slowdown bit 0x8 shows, and
  how much of it sits at an idle/busy transition, where NVML documents that the bit
  is also set during P-state and clock changes (nvml.h, nvmlClocksEventReasonHwSlowdown).
- GEMM and burn-in spread across the GPUs, from a stress report (`spread_figures`).
- The peer-copy matrix with the other ranks parked on the host (gpucheck's rule,
  `gpucheck.stress.parking`) and not parked (the old way: straight into an NCCL
  all_gather), and the longest single NVML call each rank made meanwhile
  (`p2p_main`, `p2p_comparison`).

The pure functions are tested without a GPU (tests/test_gpu_acceptance.py); the rest
needs one, or runs its CPU stand-in under --dry-run-cpu.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HW_SLOWDOWN = 0x8  # nvmlClocksEventReasonHwSlowdown
GPU_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle
BUSY_UTIL = 50  # % GPU utilisation from which a sample counts as busy
SAMPLE_S = 0.05
P2P_MODES = ("parked", "not_parked")
ONE_GPU_P2P = ("needs 2+ GPUs: peer copies go between two GPUs, and 2 NCCL ranks cannot "
               "share one GPU (NCCL refuses a duplicate GPU), so there is no valid way to "
               "run it on one")


# ---------------------------------------------------------------- pure: clock samples


def _busy(sample: Mapping[str, Any]) -> bool | None:
    util, mask = sample.get("util"), sample.get("mask")
    if util is not None:
        return int(util) >= BUSY_UTIL
    return None if mask is None else not int(mask) & GPU_IDLE


def at_transition(series: Sequence[Mapping[str, Any]], i: int) -> bool:
    """Sample i of one GPU's series is next to a busy/idle change (before or after it)."""
    here = _busy(series[i])
    return any(0 <= j < len(series) and _busy(series[j]) not in (None, here)
               for j in (i - 1, i + 1))


def _longest_run(flags: Iterable[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def _gpu_clock_summary(series: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    masks: dict[str, int] = {}
    for s in series:
        key = "n/a" if s.get("mask") is None else hex(int(s["mask"]))
        masks[key] = masks.get(key, 0) + 1
    hw = [s.get("mask") is not None and bool(int(s["mask"]) & HW_SLOWDOWN) for s in series]
    near = [at_transition(series, i) for i in range(len(series))]
    busy_sm = [int(s["sm_mhz"]) for s in series if _busy(s) and s.get("sm_mhz") is not None]
    hw_sm = [int(s["sm_mhz"]) / int(s["sm_max_mhz"]) for s, flag in zip(series, hw, strict=True)
             if flag and s.get("sm_mhz") and s.get("sm_max_mhz")]
    return {"samples": len(series), "masks": dict(sorted(masks.items())),
            "hw_slowdown_samples": sum(hw),
            "hw_slowdown_at_transition": sum(h and n for h, n in zip(hw, near, strict=True)),
            "hw_slowdown_steady": sum(h and not n for h, n in zip(hw, near, strict=True)),
            "hw_slowdown_longest_run": _longest_run(hw),
            "transition_samples": sum(near),
            "busy_sm_mhz": {"min": min(busy_sm), "median": statistics.median(busy_sm),
                            "max": max(busy_sm)} if busy_sm else None,
            "hw_slowdown_sm_of_max": {"min": round(min(hw_sm), 3),
                                      "median": round(statistics.median(hw_sm), 3)}
            if hw_sm else None}


def clock_summary(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per GPU: how often each mask showed, how often 0x8, and how much of 0x8 was at
    a busy/idle transition (a sample next to a change) or in a steady stretch."""
    by_gpu: dict[int, list[Mapping[str, Any]]] = {}
    for sample in sorted(samples, key=lambda s: float(s["t"])):
        by_gpu.setdefault(int(sample["gpu"]), []).append(sample)
    return {str(gpu): _gpu_clock_summary(series) for gpu, series in sorted(by_gpu.items())}


# ---------------------------------------------------------------- pure: stress spread


def _spread(values: Mapping[int, float]) -> dict[str, Any]:
    low, high = min(values.values()), max(values.values())
    median = statistics.median(values.values())
    return {"per_rank": {str(k): v for k, v in sorted(values.items())}, "min": low,
            "median": median, "max": high,
            "min_over_median": round(low / median, 4) if median else None,
            "max_over_min": round(high / low, 4) if low else None}


def spread_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """GEMM TFLOP/s (median product) per dtype and burn-in median product time, per
    rank, with min/median and max/min across the GPUs; a note with one rank."""
    sections = {s.get("name"): s.get("data") or {} for s in report.get("sections") or []}
    gemm: dict[str, dict[int, float]] = {}
    for row in (sections.get("gemm") or {}).get("results") or []:
        gemm.setdefault(str(row["dtype"]), {})[int(row["rank"])] = float(row["tflops_p50"])
    burn = {int(r["rank"]): float(r["p50_ms"])
            for r in (sections.get("sdc") or {}).get("results") or []}
    out: dict[str, Any] = {"gemm_tflops": {d: _spread(v) for d, v in gemm.items()},
                           "burn_in_p50_ms": _spread(burn) if burn else None}
    ranks = max([len(v) for v in gemm.values()] + [len(burn)])
    if ranks < 2:
        out["note"] = "one rank: no spread across GPUs to measure"
    membw = (sections.get("membw") or {}).get("results") or []
    out["membw_gbps_p50"] = {str(r["rank"]): r.get("gbps_p50") for r in membw}
    out["membw_counted"] = (sections.get("membw") or {}).get("counted")
    return out


# ---------------------------------------------------------------- pure: p2p


def _pairs(run: Mapping[str, Any]) -> dict[tuple[int, int], float]:
    return {(int(p["src"]), int(p["dst"])): float(p["gbps"]) for p in run.get("pairs") or []
            if p.get("gbps") is not None}


def p2p_comparison(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per ordered pair the median GB/s parked and not parked and their ratio; the
    median ratio; per mode the longest single NVML call any rank made."""
    by_mode: dict[str, list[dict[tuple[int, int], float]]] = {m: [] for m in P2P_MODES}
    nvml: dict[str, list[float]] = {m: [] for m in P2P_MODES}
    for run in runs:
        by_mode[run["mode"]].append(_pairs(run))
        nvml[run["mode"]] += [float(v) for v in (run.get("nvml_max_call_ms") or {}).values()
                              if v is not None]
    keys = sorted({k for mode in by_mode.values() for pairs in mode for k in pairs})
    rows = []
    for key in keys:
        parked = [p[key] for p in by_mode["parked"] if key in p]
        busy = [p[key] for p in by_mode["not_parked"] if key in p]
        a = statistics.median(parked) if parked else None
        b = statistics.median(busy) if busy else None
        rows.append({"src": key[0], "dst": key[1], "parked_gbps": a, "not_parked_gbps": b,
                     "parked_over_not": round(a / b, 4) if a and b else None})
    ratios = [r["parked_over_not"] for r in rows if r["parked_over_not"] is not None]
    return {"pairs": rows, "median_parked_over_not": statistics.median(ratios) if ratios
            else None,
            "nvml_max_call_ms": {m: max(v) if v else None for m, v in nvml.items()}}


# ---------------------------------------------------------------- clock sampler


class ClockSampler:
    """A thread that samples every GPU's clock-event mask, SM clock (and its maximum)
    and utilisation every SAMPLE_S through pynvml, timing every call; `nvidia-smi`
    is not used (its own start-up would dominate a 50 ms period). `error` says why
    nothing was sampled (no pynvml, no driver)."""

    def __init__(self, gpus: Sequence[int] | None = None) -> None:
        self.samples: list[dict[str, Any]] = []
        self.max_call_ms = 0.0
        self.error: str | None = None
        self._gpus = gpus
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _call(self, function: Any, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args)
        except Exception:  # NotSupported and the like: n/a for this field
            return None
        finally:
            self.max_call_ms = max(self.max_call_ms, (time.perf_counter() - began) * 1e3)

    def _run(self) -> None:
        try:
            import pynvml as nv

            nv.nvmlInit()
        except Exception as exc:  # no package or no driver: say so in the summary
            self.error = f"NVML not available: {type(exc).__name__}: {exc}"
            return
        try:
            count = nv.nvmlDeviceGetCount()
            handles = {i: nv.nvmlDeviceGetHandleByIndex(i)
                       for i in (self._gpus if self._gpus is not None else range(count))}
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            top = {i: self._call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
                   for i, h in handles.items()}
            while not self._stop.is_set():
                for i, handle in handles.items():
                    util = self._call(nv.nvmlDeviceGetUtilizationRates, handle)
                    self.samples.append({
                        "t": time.monotonic(), "gpu": i, "mask": self._call(reasons, handle),
                        "sm_mhz": self._call(nv.nvmlDeviceGetClockInfo, handle,
                                             nv.NVML_CLOCK_SM),
                        "sm_max_mhz": top[i], "util": util.gpu if util is not None else None})
                self._stop.wait(SAMPLE_S)
        except Exception as exc:  # a GPU that cannot be opened: say so, keep the samples
            self.error = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
        finally:
            nv.nvmlShutdown()

    def summary(self) -> dict[str, Any]:
        if self.error:
            return {"status": "skipped", "note": self.error}
        return {"status": "ok", "sample_period_s": SAMPLE_S, "busy_util_pct": BUSY_UTIL,
                "max_nvml_call_ms": round(self.max_call_ms, 3),
                "gpus": clock_summary(self.samples)}


# ---------------------------------------------------------------- p2p ranks (own processes)


def _cpu_stand_in(local_world_size: int) -> dict[str, Any]:
    """Dry run only: host copies between two CPU buffers stand in for each pair, so the
    parked / not parked pipeline runs end to end without a GPU (figures meaningless)."""
    import torch

    src, dst = torch.ones(8 << 20, dtype=torch.uint8), torch.empty(8 << 20, dtype=torch.uint8)
    pairs = []
    for a in range(local_world_size):
        for b in range(local_world_size):
            if a != b:
                began = time.perf_counter()
                for _ in range(5):
                    dst.copy_(src)
                gbps = 5 * src.numel() / (time.perf_counter() - began) / 1e9
                pairs.append({"src": a, "dst": b, "peer_access": True, "gbps": gbps})
    return {"pairs": pairs}


def _p2p_rank(rank: int, config: dict[str, Any], store_path: str, out: str) -> None:
    """One rank: a sampler on its own GPU's NVML while rank 0 measures; the others
    park on a gloo barrier (gpucheck's rule) or enter the NCCL gather at once."""
    import torch
    import torch.distributed as dist

    from gpucheck.stress.copies import peer_matrix
    from gpucheck.stress.parking import host_wait

    world, cuda = int(config["world_size"]), config["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    timeout = float(config["timeout_s"])
    dist.init_process_group(config["backend"], store=dist.FileStore(store_path, world),
                            rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=timeout))
    try:
        parking = host_wait(config["backend"], world, range(world), timeout)
        dist.barrier(device_ids=[rank]) if cuda else dist.barrier()
        # NVML index = CUDA ordinal: true on a machine without CUDA_VISIBLE_DEVICES and
        # with identical GPUs, which is what the acceptance run expects.
        with ClockSampler([rank] if cuda else []) as sampler:
            mine: dict[str, Any] = {}
            if rank == 0:
                mine = (peer_matrix if cuda else _cpu_stand_in)(world)
            if config["mode"] == "parked" and parking is not None:
                parking.wait()
            every: list[Any] = [None] * world
            dist.all_gather_object(every, {"rank": rank, "nvml_max_call_ms": round(
                sampler.max_call_ms, 3) if not sampler.error else None})
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({
            "mode": config["mode"], **mine,
            "nvml_max_call_ms": {str(e["rank"]): e["nvml_max_call_ms"] for e in every}}))


def p2p_main(config: dict[str, Any], out: Path) -> None:
    import shutil
    import tempfile

    import torch.multiprocessing as mp

    folder = tempfile.mkdtemp(prefix="gpu-acceptance-p2p-")
    try:
        mp.spawn(_p2p_rank, args=(config, os.path.join(folder, "store"), str(out)),
                 nprocs=int(config["world_size"]), join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
