"""The one doorway to NVML (`Nvml`: each call on one worker thread under a budget, a late
call given a second budget before it counts as hung; docs/env.md, "Slow is not lost" in
docs/faults.md), its field values (`read_fields`), and NVML's name for a CUDA device."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from gpucheck.devices import GpuIdentity, bus_id_of, uuid_of

DEFAULT_TIMEOUT_S = 3.0
ATTACH_TIMEOUT_S = 30.0
# The second budget a late call gets: as patient as a GPU's bring-up.
RETRY_TIMEOUT_S = 30.0
# The calls that attach (bring up) a GPU the first time they name it.
ATTACH_PREFIX = "nvmlDeviceGetHandleBy"

# NVMLError subclass name -> (short meaning, what to do).
MEANINGS: dict[str, tuple[str, str]] = {
    "NVMLError_LibraryNotFound": (
        "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) was not found",
        "install the NVIDIA driver, or run inside a container started with the GPU runtime "
        "(docker --gpus all)"),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA kernel driver is not loaded",
        "load it (sudo modprobe nvidia) or reinstall the driver; check dmesg for errors"),
    "NVMLError_LibRmVersionMismatch": (
        "driver/library version mismatch: the loaded kernel module differs from the "
        "user-space NVML library",
        "reboot after the driver upgrade (or reload the nvidia kernel modules)"),
    "NVMLError_GpuIsLost": (
        "the GPU is lost (fell off the bus)",
        "check dmesg for Xid 79; reset the GPU (nvidia-smi -r) or power-cycle the node"),
    "NVMLError_ResetRequired": (
        "the GPU needs a reset",
        "reset the GPU (nvidia-smi -r -i <index>) or reboot the node"),
    "NVMLError_NoPermission": (
        "not permitted to query this",
        "run as a user allowed to access /dev/nvidia* (or as root)"),
    "NVMLError_NotSupported": ("not supported on this GPU", ""),
    "NVMLError_FunctionNotFound": (
        "this driver's NVML lacks the function (driver older than nvidia-ml-py)", ""),
    "NVMLError_Uninitialized": ("NVML is not initialised", "report a gpucheck bug"),
    "NVMLError_Timeout": ("the NVML call timed out in the driver",
                         "check dmesg for Xid errors; the GPU may need a reset"),
    # Our own: no answer within its budget nor the second (the doorway closes).
    "Timeout": ("no answer from the driver (within two budgets)",
                "check dmesg for Xid errors; the GPU may need a reset (nvidia-smi -r) or the "
                "node a reboot"),
}
# NVMLError subclass name -> the cause key a finding carries (gpucheck.checks).
CAUSES: dict[str, str] = {
    "NVMLError_GpuIsLost": "gpu_lost",
    "NVMLError_ResetRequired": "needs_reset",
    "NVMLError_Timeout": "timed_out",
    "Timeout": "no_answer",
    "NVMLError_NoPermission": "no_permission",
}
# Field-level errors that mean "this GPU/driver does not have it": shown as n/a.
NOT_AVAILABLE = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound",
                 "NVMLError_NotFound", "NVMLError_NoData", "NVMLError_InvalidArgument",
                 "NVMLError_NoPermission")


class NvmlFailure(Exception):
    """An NVML call failed; `kind` is the NVMLError subclass name (or 'Timeout')."""

    def __init__(self, kind: str, detail: str, function: str) -> None:
        self.kind = kind
        self.detail = detail
        self.function = function
        super().__init__(f"{function}: {self.meaning} ({detail})")

    @property
    def meaning(self) -> str:
        return MEANINGS.get(self.kind, (self.detail, ""))[0]

    @property
    def hint(self) -> str:
        hint = MEANINGS.get(self.kind, ("", ""))[1]
        return hint or "run nvidia-smi to see whether the driver itself reports the problem"

    @property
    def cause(self) -> str | None:
            return CAUSES.get(self.kind)

    @property
    def not_available(self) -> bool:
        """True when the field simply does not exist on this GPU/driver (show n/a)."""
        return self.kind in NOT_AVAILABLE


SLOW_ADVICE = ("the call answered and nothing is missing; a late answer is most often the "
               "driver busy with other work on the node (CUDA contexts being created, other "
               "processes' NVML calls), which is why only a call that also misses a second, "
               "longer budget counts as a hung GPU. If it recurs on one GPU while the node is "
               "otherwise idle, check dmesg for Xid errors")


def slow_words(calls: Sequence[tuple[str, float, float]]) -> str:
    """"nvmlDeviceGetTemperature answered after 4.2 s (its budget: 3 s)", from (function,
    waited_s, budget_s); several are counted."""
    function, waited_s, budget_s = max(calls, key=lambda c: c[1])
    slowest = f"{function} answered after {waited_s:g} s (its budget: {budget_s:g} s)"
    return slowest if len(calls) == 1 else (f"{len(calls)} NVML calls answered late, the "
                                            f"slowest {slowest}")


def decode(value: Any) -> Any:
    """NVML strings arrive as bytes from some nvidia-ml-py versions."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class SlowCall(NamedTuple):
    """A call that missed its budget but answered within the second one."""

    function: str
    waited_s: float  # from the call to its answer, queueing included
    budget_s: float  # the budget it missed


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: threading.Event
    result: Any = None
    error: BaseException | None = None


class Nvml:
    """Lazy NVML session: `call("nvmlDeviceGetName", handle)` -> decoded value or
    NvmlFailure."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S,
                 attach_timeout_s: float = ATTACH_TIMEOUT_S,
                 retry_timeout_s: float = RETRY_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.attach_timeout_s = max(attach_timeout_s, timeout_s)
        self.retry_timeout_s = retry_timeout_s
        self.slow_calls: list[SlowCall] = []  # appended by the callers' threads
        self._attached: set[tuple[str, str]] = set()
        self._module: Any = None
        self._start_error: NvmlFailure | None = None
        self._started = False
        self._hung: NvmlFailure | None = None
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def module(self) -> Any:
        return self._module

    def start(self) -> None:
        """Import pynvml and nvmlInit once; raises NvmlFailure (kept for later calls)."""
        with self._lock:
            if not self._started:
                self._started = True
                self._start_error = self._try_start()
        if self._start_error is not None:
            raise self._start_error

    def _try_start(self) -> NvmlFailure | None:
        try:
            import pynvml
        except ImportError as exc:
            return NvmlFailure("ImportError", f"cannot import pynvml: {exc}", "import pynvml")
        self._module = pynvml
        try:
            self._run(pynvml.nvmlInit, (), {}, "nvmlInit", self.attach_timeout_s)
        except NvmlFailure as exc:
            return exc
        return None

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.start()
        fn = getattr(self._module, name, None)
        if fn is None:
            raise NvmlFailure("NVMLError_FunctionNotFound", "not in this pynvml", name)
        attach = (name, repr(args)) if name.startswith(ATTACH_PREFIX) else None
        if attach is None or attach in self._attached:
            return decode(self._run(fn, args, kwargs, name, self.timeout_s))
        result = decode(self._run(fn, args, kwargs, name, self.attach_timeout_s,
                                  " (the first attach of this GPU, which brings it up "
                                  "when persistence mode is off)"))
        self._attached.add(attach)
        return result

    def get(self, name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        """Like `call` but a not-available field gives `default` (n/a)."""
        try:
            return self.call(name, *args, **kwargs)
        except NvmlFailure as exc:
            if exc.not_available:
                return default
            raise

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             name: str, budget_s: float, what: str = "") -> Any:
        if self._hung is not None:
            raise NvmlFailure("Timeout", f"an earlier call ({self._hung.function}) hung",
                              name)
        job = _Job(fn, args, kwargs, threading.Event())
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="gpucheck-nvml",
                                            daemon=True)
            self._worker.start()
        started = time.monotonic()
        self._jobs.put(job)
        if not job.done.wait(budget_s):
            if not job.done.wait(self.retry_timeout_s):  # the second, longer budget
                self._hung = NvmlFailure(
                    "Timeout", f"no answer within {budget_s:g} s{what}, nor in "
                    f"{self.retry_timeout_s:g} s more", name)
                raise self._hung
            self.slow_calls.append(SlowCall(name, round(time.monotonic() - started, 3),
                                            budget_s))
        if job.error is not None:
            # NVMLError subclasses are named NVMLError_<Meaning>; anything else keeps its name.
            raise NvmlFailure(type(job.error).__name__, str(job.error), name) from job.error
        return job.result

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn(*job.args, **job.kwargs)
            except BaseException as exc:  # handed back to the caller's thread
                job.error = exc
            job.done.set()

    @property
    def hung(self) -> NvmlFailure | None:
        """The hang (both budgets missed) that closed the doorway, if any."""
        return self._hung

    @property
    def longest_wait_s(self) -> float:
        """The longest one steady-state call can keep its caller waiting."""
        return self.timeout_s + self.retry_timeout_s

    def shutdown(self) -> None:
        """nvmlShutdown when started and not hung (best effort)."""
        if self._module is not None and self._start_error is None and self._hung is None:
            with contextlib.suppress(NvmlFailure):
                self._run(self._module.nvmlShutdown, (), {}, "nvmlShutdown", self.timeout_s)


# ---- field values (nvmlDeviceGetFieldValues) ----

K = TypeVar("K")  # read_fields' names for the fields it reads


class NvmlDoor(Protocol):
    """`Nvml`, or `Nvml` with its calls metered (the fault watcher's)."""

    @property
    def module(self) -> Any: ...

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...

    def get(self, name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any: ...


# nvmlValueType_t -> the member of c_nvmlValue_t that holds a field value.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                  6: "usVal"}


def _member(value: Any) -> float | int | None:
    if int(value.nvmlReturn) != 0:  # NVML_SUCCESS
        return None
    member = _VALUE_MEMBERS.get(int(value.valueType))
    return None if member is None else getattr(value.value, member)


def read_fields(nvml: NvmlDoor, handle: Any,
                wanted: Mapping[K, tuple[str, int]]) -> dict[K, float | int | None]:
    """Several `nvmlDeviceGetFieldValues` fields in one call: name -> (pynvml constant,
    scopeId); None per field pynvml or the GPU lacks."""
    m = nvml.module
    ids = {n: getattr(m, c) for n, (c, _) in wanted.items() if getattr(m, c, None) is not None}
    out: dict[K, float | int | None] = dict.fromkeys(wanted)
    if not ids:
        return out
    values = nvml.get("nvmlDeviceGetFieldValues", handle,
                      [(field_id, wanted[n][1]) for n, field_id in ids.items()])
    for name, value in zip(ids, values or (), strict=False):
        out[name] = _member(value)
    return out


def field_value(nvml: NvmlDoor, handle: Any, constant: str) -> float | int | None:
    """One `nvmlDeviceGetFieldValues` field by its pynvml constant; None when n/a."""
    return read_fields(nvml, handle, {"value": (constant, 0)})["value"]


# ---- NVML's name for a CUDA device ----

def nvml_index_and_mig(bus_id: str | None, nvml: Any | None = None) -> tuple[int | None, bool]:
    """NVML's index of the GPU at this PCI address and whether its MIG mode is on
    (`nvidia-smi --query-gpu=index,mig.mode.current`); None and False where NVML cannot tell."""
    if not bus_id:
        return None, False
    own = nvml is None
    nvml = nvml or Nvml()
    index, modes = None, None
    try:
        handle = nvml.call("nvmlDeviceGetHandleByPciBusId", bus_id)
        with contextlib.suppress(NvmlFailure):
            index = int(nvml.call("nvmlDeviceGetIndex", handle))
        with contextlib.suppress(NvmlFailure):
            modes = nvml.get("nvmlDeviceGetMigMode", handle)
    except NvmlFailure:
        pass
    finally:
        if own:
            nvml.shutdown()
    current = modes[0] if isinstance(modes, (list, tuple)) and modes else modes
    return index, bool(current)


def cuda_identity(torch: Any, ordinal: int, nvml: Any = None) -> GpuIdentity:
    """Name cuda:<ordinal> of this process by NVML index, bus id and UUID (a MIG
    instance's as "MIG-..."; CUDA_VISIBLE_DEVICES=MIG-... tells it when NVML cannot)."""
    props = torch.cuda.get_device_properties(ordinal)
    bus_id = bus_id_of(props)
    index, mig = nvml_index_and_mig(bus_id, nvml)
    mig = mig or os.environ.get("CUDA_VISIBLE_DEVICES", "").strip().startswith("MIG-")
    return GpuIdentity(cuda_ordinal=ordinal, nvml_index=index, name=str(props.name),
                       pci_bus_id=bus_id, uuid=uuid_of(props, mig))
