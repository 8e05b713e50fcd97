"""The raw signals issues 22 and 23 ask the acceptance run to read on a real GPU
(benchmarks/gpu_acceptance.py's second helper). Each is read here directly, through
pynvml, ctypes or torch, whether or not gpucheck's own feature for it has landed, so
the run says what the hardware answers:

- the loaded NCCL (path and `ncclGetVersion`) and cuBLAS (`cublasGetProperty`), beside
  the versions torch was built with (`loaded_libraries`, in a child with torch);
- topology classes: per GPU pair `nvmlDeviceGetTopologyCommonAncestor` and the P2P read
  status, per GPU the NVLinks up (`topology_classes`; `nvidia-smi topo -m`, `-p2p r`);
- NVLink5 and bank-remap field values, raw (`field_readings`): 215 link recovery
  events, 219/220 effective errors and BER, 221/222 symbol errors and BER, 235-250
  the FEC history, 303/304 active/inactive bank remaps (nvml.h NVML_FI_DEV_*);
- per-process utilisation of an idle and a busy process (`process_view`): NVML
  answers NotFound when no process has a sample in the window, and lists an idle
  process only among the running compute processes;
- power draw under a GEMM against the enforced and default limits (`power_figures`);
- a planted Flight Recorder timeout (`planted_main`): one NCCL rank whose collective
  waits behind a long GPU sleep (its watchdog times it out and dumps), or on CPU two
  gloo ranks where rank 1 never joins (each rank writes `_dump_fr_trace()` itself).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# nvml.h field ids, raw (nvidia-ml-py 13 names them NVML_FI_DEV_NVLINK_COUNT_*, ...).
NVLINK5_FIELDS = (215, 219, 220, 221, 222, *range(235, 251))
BANK_REMAP_FIELDS = (303, 304)
FIELD_IDS = (*NVLINK5_FIELDS, *BANK_REMAP_FIELDS)
# c_nvmlValue_t's members in NVML_VALUE_TYPE_* order (double, uint, ulong, ulonglong,
# slonglong, sint, ushort).
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
TOPOLOGY = {0: "internal", 10: "single PCIe switch", 20: "multiple PCIe switches",
            30: "host bridge", 40: "NUMA node (across PCIe host bridges)",
            50: "system (across sockets, SMP interconnect)"}
P2P_STATUS = {0: "ok", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}
P2P_READ = 0  # NVML_P2P_CAPS_INDEX_READ (pynvml writes it as a one-element tuple)
NVLINK_MAX = 18  # links per GPU up to Blackwell (NVML_NVLINK_MAX_LINKS is 36)


def open_nvml() -> tuple[Any, str | None]:
    """(pynvml, None) started, or (None, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no package, no driver, no permission: all are "no NVML"
        return None, f"NVML not available ({type(exc).__name__}: {exc})"
    return pynvml, None


def _error(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _value(entry: Any) -> Any:
    kind = int(getattr(entry, "valueType", 3))
    member = VALUE_MEMBERS[kind] if 0 <= kind < len(VALUE_MEMBERS) else "ullVal"
    return getattr(entry.value, member)


def field_readings(nvml: Any, handle: Any, ids: Sequence[int] = FIELD_IDS) -> dict[str, Any]:
    """{field id: {"return": 0 or NVML's error code, "value": the value or None}}; a
    refused call as a whole is {"error": ...}."""
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, list(ids))
    except Exception as exc:
        return {"error": _error(exc)}
    out: dict[str, Any] = {}
    for field_id, entry in zip(ids, values, strict=False):
        code = int(entry.nvmlReturn)
        out[str(field_id)] = {"return": code, "value": _value(entry) if code == 0 else None}
    return out


def fields_summary(readings: Mapping[str, Any]) -> dict[str, Any]:
    """How many fields answered, and which did not (NotSupported is code 3)."""
    if "error" in readings:
        return {"read": 0, "not_read": len(FIELD_IDS), "error": readings["error"]}
    answered = [k for k, v in readings.items() if v["return"] == 0]
    return {"read": len(answered), "not_read": len(readings) - len(answered),
            "answered": answered,
            "nonzero": {k: readings[k]["value"] for k in answered if readings[k]["value"]}}


def _call(nvml: Any, name: str, *args: Any) -> tuple[Any, str | None]:
    try:
        return getattr(nvml, name)(*args), None
    except Exception as exc:
        return None, _error(exc)


def nvlinks_up(nvml: Any, handle: Any) -> int | None:
    """NVLinks whose state reads 1 (None: NVML refuses the first link: no NVLink)."""
    up = 0
    for link in range(NVLINK_MAX):
        state, error = _call(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if error is not None:
            return None if link == 0 else up
        up += int(state == 1)
    return up


def topology_classes(nvml: Any) -> dict[str, Any]:
    """Every GPU's NVLinks up, and per pair the common ancestor and P2P read status."""
    count, error = _call(nvml, "nvmlDeviceGetCount")
    if error is not None:
        return {"error": error}
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(count))]
    gpus = [{"index": i, "nvlinks_up": nvlinks_up(nvml, h)} for i, h in enumerate(handles)]
    pairs = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            level, level_error = _call(nvml, "nvmlDeviceGetTopologyCommonAncestor",
                                       handles[i], handles[j])
            p2p, p2p_error = _call(nvml, "nvmlDeviceGetP2PStatus", handles[i], handles[j],
                                   P2P_READ)
            pairs.append({"pair": [i, j], "ancestor": level,
                          "ancestor_class": TOPOLOGY.get(level, level_error or str(level)),
                          "p2p_read": P2P_STATUS.get(p2p, p2p_error or str(p2p))})
    classes: dict[str, int] = {}
    for pair in pairs:
        key = f"{pair['ancestor_class']} / p2p {pair['p2p_read']}"
        classes[key] = classes.get(key, 0) + 1
    return {"gpus": gpus, "pairs": pairs, "classes": classes,
            "note": None if pairs else f"{len(handles)} GPU(s): no pair to classify"}


def process_view(nvml: Any, handle: Any, pids: Mapping[str, int],
                 window_s: float) -> dict[str, Any]:
    """What NVML says of each named process: listed among the running compute processes,
    and its SM utilisation samples since `window_s` ago (lastSeenTimeStamp, in µs)."""
    listed, list_error = _call(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    since = int((time.time() - window_s) * 1e6)
    samples, sample_error = _call(nvml, "nvmlDeviceGetProcessUtilization", handle, since)
    running = {int(p.pid) for p in listed or []}
    util: dict[int, list[int]] = {}
    for sample in samples or []:
        util.setdefault(int(sample.pid), []).append(int(sample.smUtil))
    view = {name: {"pid": pid, "listed": pid in running,
                   "sm_util_samples": util.get(pid, [])} for name, pid in pids.items()}
    return {"processes": view, "list_error": list_error, "samples_error": sample_error}


def process_verdict(view: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, figure): the busy process has a non-zero sample, the idle one is listed
    with none (what `gpucheck hang` must read as 0 %, not unknown)."""
    procs = view.get("processes") or {}
    busy, idle = procs.get("busy") or {}, procs.get("idle") or {}
    busy_util = max(busy.get("sm_util_samples") or [0])
    figure = (f"busy {busy_util}% ({'listed' if busy.get('listed') else 'not listed'}), idle "
              f"{'listed' if idle.get('listed') else 'not listed'} with "
              f"{len(idle.get('sm_util_samples') or [])} sample(s); samples call: "
              f"{view.get('samples_error') or 'answered'}")
    ok = busy_util > 0 and bool(idle.get("listed")) and not any(idle.get("sm_util_samples")
                                                                 or [])
    return ("PASS" if ok else "FAIL"), figure


def power_figures(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Highest and median draw under the GEMM against the enforced limit (DCGM's
    targeted-power idea: a healthy GPU under a dense GEMM draws most of its limit)."""
    draws = sorted(s["power_w"] for s in samples if s.get("power_w") is not None)
    limit = next((s["limit_w"] for s in samples if s.get("limit_w")), None)
    default = next((s["default_limit_w"] for s in samples if s.get("default_limit_w")), None)
    errors = next((s["errors"] for s in samples if s.get("errors")), None)
    if not draws or not limit:
        return {"samples": len(draws), "limit_w": limit, "default_limit_w": default,
                "errors": errors}
    return {"samples": len(draws), "max_w": draws[-1], "median_w": draws[len(draws) // 2],
            "limit_w": limit, "default_limit_w": default,
            "max_over_limit": round(draws[-1] / limit, 3),
            "limit_below_default": bool(default and limit < default), "errors": errors}


def power_sample(nvml: Any, handle: Any) -> dict[str, Any]:
    """One reading in W; a call NVML (or this nvidia-ml-py) refuses is named in "errors"."""
    draw, e1 = _call(nvml, "nvmlDeviceGetPowerUsage", handle)
    limit, e2 = _call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    default, e3 = _call(nvml, "nvmlDeviceGetPowerManagementDefaultLimit", handle)
    errors = {k: e for k, e in (("power", e1), ("limit", e2), ("default_limit", e3)) if e}
    return {"t": time.monotonic(), "power_w": None if draw is None else draw / 1000,
            "limit_w": None if limit is None else limit / 1000,
            "default_limit_w": None if default is None else default / 1000, "errors": errors}


# ---------------------------------------------------------------- child processes


def loaded_libraries() -> dict[str, Any]:
    """In a process with torch imported (and, on a GPU, a GEMM run): the loaded NCCL and
    cuBLAS beside the build's NCCL."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpucheck.probes.torch_build import loaded_nccl
    from gpucheck.stress.blas import loaded_blas

    if torch.cuda.is_available():  # cuBLAS is mapped by its first use at the latest
        a = torch.ones(64, 64, device="cuda")
        (a @ a).sum().item()
    build = None
    try:
        version = torch.cuda.nccl.version()
        build = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except (AttributeError, RuntimeError) as exc:
        build = f"unknown: {exc}"
    nccl, blas = loaded_nccl(), loaded_blas(torch)
    return {"nccl_build": build, "nccl_loaded": nccl.version, "nccl_path": nccl.path,
            "nccl_note": nccl.why, "cublas_loaded": blas.cublas, "cublaslt": blas.cublaslt,
            "cublas_path": blas.path, "cublas_note": blas.why_unknown,
            "blas_key": blas.key(), "cuda_runtime_build": torch.version.cuda}


def load_main(config: Mapping[str, Any], ready: Path) -> None:
    """A process that holds a CUDA context and sleeps ("idle"), or runs bf16 GEMMs
    ("busy"), for config["seconds"]; it touches `ready` once it is doing so."""
    import torch

    end = time.monotonic() + float(config["seconds"])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    if config["mode"] == "idle":
        torch.cuda.synchronize()
        ready.touch()
        while time.monotonic() < end:
            time.sleep(0.1)
        return
    b = a.clone()
    (a @ b).sum().item()
    ready.touch()
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()


def planted_main(config: Mapping[str, Any], out: Path) -> None:
    """Plant a collective timeout with the Flight Recorder armed (the parent set
    TORCH_FR_* and TORCH_NCCL_DUMP_ON_TIMEOUT): on a GPU one NCCL rank, on CPU two gloo
    ranks. The dumps land at config["prefix"]<rank>; `out` says what each rank saw."""
    import torch.multiprocessing as mp

    if config["device"] == "cuda":
        _planted_nccl(config, out)
    else:
        mp.spawn(_planted_gloo, args=(config, str(out)), nprocs=2, join=True)


def _planted_nccl(config: Mapping[str, Any], out: Path) -> None:
    """The all_reduce waits on the stream behind a GPU sleep longer than the timeout: the
    watchdog (TORCH_NCCL_BLOCKING_WAIT=0, so it exists) times it out, dumps, and ends
    this process; `out` is written only if it survives."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    store = dist.FileStore(str(config["store"]), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                            timeout=_dt.timedelta(seconds=float(config["timeout_s"])))
    buf = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(config["sleep_cycles"]))
    dist.all_reduce(buf)
    started = time.monotonic()
    torch.cuda.synchronize()
    out.write_text(f'{{"survived_s": {time.monotonic() - started:.1f}}}\n')


def _planted_gloo(rank: int, config: Mapping[str, Any], out: str) -> None:
    """Rank 1 never joins the all_reduce; rank 0's times out; each rank then writes its
    own buffer (`_dump_fr_trace()`; gloo has no watchdog that dumps)."""
    import torch
    import torch.distributed as dist

    store = dist.FileStore(str(config["store"]), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=_dt.timedelta(seconds=float(config["timeout_s"])))
    buf = torch.ones(16)
    dist.all_reduce(buf)
    if rank == 0:
        try:
            dist.all_reduce(buf)
            said = "the all_reduce did not time out"
        except RuntimeError as exc:  # the planted timeout: what gloo says is the figure
            said = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "timeout"
        Path(out).write_text(json.dumps({"rank0": said}) + "\n")
    else:
        time.sleep(float(config["timeout_s"]) + 1)
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump is None:
        Path(f"{out}.{rank}.skip").write_text("this torch has no _dump_fr_trace\n")
        return
    Path(f"{config['prefix']}{rank}").write_bytes(dump())
    os._exit(0)  # the group is broken: leave without its teardown
