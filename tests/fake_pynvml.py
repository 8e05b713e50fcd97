"""A faithful fake of the `pynvml` module (nvidia-ml-py) for GPU-less tests.

Same function names, signatures, return shapes and NVMLError class hierarchy as
nvidia-ml-py 12/13 (NVMLError(value) maps to NVMLError_<Name> subclasses and
carries `.value`). GPUs are `FakeGpu` records whose faults are set per test.

When it returns and when it raises follows the NVML API reference
(docs.nvidia.com/deploy/nvml-api: "Device Queries", "Initialization and Cleanup",
"Field Value Queries", "Event Handling Methods", "NvLink Methods"). The table names
every NVML function gpucheck calls with the errors its "Returns" list documents
besides SUCCESS, UNKNOWN and the two every row has (pynvml's class names,
NVMLError_<Name>); tests/test_fake_nvml_reference.py fails when gpucheck calls a
function the table does not name.

The two every row has: a call before nvmlInit (or after the nvmlShutdown that ends
the last nvmlInit: NVML counts them) answers Uninitialized, except in the rows marked
"(no init)"; and a device call on a GPU that fell off the bus answers GpuIsLost (the
reference lists it for most device queries; the driver answers it for all).
FunctionNotFound, pynvml's answer when the driver's library lacks the function, can
follow any call (`FakeNvml.absent`). A test injects the other errors per GPU
(`FakeGpu.unsupported`: NotSupported, `denied`: NoPermission, `racing`:
InsufficientSize); injecting one the function's row does not name is refused with an
AssertionError, so no test can make NVML answer what it never answers.

| function | documented errors |
|---|---|
| nvmlInit | (no init), DriverNotLoaded, NoPermission, LibRmVersionMismatch, LibraryNotFound |
| nvmlShutdown | (the two every row has) |
| nvmlSystemGetDriverVersion | InvalidArgument, InsufficientSize |
| nvmlSystemGetCudaDriverVersion | (no init), InvalidArgument |
| nvmlSystemGetCudaDriverVersion_v2 | (no init), InvalidArgument, LibraryNotFound |
| nvmlDeviceGetCount | InvalidArgument |
| nvmlDeviceGetHandleByIndex | InvalidArgument, InsufficientPower, NoPermission, IrqIssue |
| nvmlDeviceGetHandleByPciBusId | InvalidArgument, NotFound, InsufficientPower, DriverNotLoaded |
| nvmlDeviceGetIndex | InvalidArgument |
| nvmlDeviceGetName | InvalidArgument, InsufficientSize |
| nvmlDeviceGetUUID | InvalidArgument, InsufficientSize, NotSupported |
| nvmlDeviceGetPciInfo | InvalidArgument |
| nvmlDeviceGetMemoryInfo | NoPermission, InvalidArgument, ArgumentVersionMismatch |
| nvmlDeviceGetCudaComputeCapability | InvalidArgument |
| nvmlDeviceGetPersistenceMode | InvalidArgument, NotSupported |
| nvmlDeviceGetMigMode | InvalidArgument, NotSupported |
| nvmlDeviceGetTemperature | InvalidArgument, NotSupported |
| nvmlDeviceGetPowerUsage | InvalidArgument, NotSupported |
| nvmlDeviceGetEnforcedPowerLimit | InvalidArgument, NotSupported |
| nvmlDeviceGetPowerManagementDefaultLimit | InvalidArgument, NotSupported |
| nvmlDeviceGetClockInfo | InvalidArgument, NotSupported |
| nvmlDeviceGetMaxClockInfo | InvalidArgument, NotSupported |
| nvmlDeviceGetUtilizationRates | InvalidArgument, NotSupported |
| nvmlDeviceGetComputeRunningProcesses | InvalidArgument, InsufficientSize, NoPermission |
| nvmlDeviceGetGraphicsRunningProcesses | InvalidArgument, InsufficientSize, NoPermission |
| nvmlDeviceGetProcessUtilization | InvalidArgument, NotSupported, NotFound |
| nvmlDeviceGetCurrPcieLinkGeneration | InvalidArgument, NotSupported |
| nvmlDeviceGetMaxPcieLinkGeneration | InvalidArgument, NotSupported |
| nvmlDeviceGetCurrPcieLinkWidth | InvalidArgument, NotSupported |
| nvmlDeviceGetMaxPcieLinkWidth | InvalidArgument, NotSupported |
| nvmlDeviceGetPcieReplayCounter | InvalidArgument, NotSupported |
| nvmlDeviceGetEccMode | InvalidArgument, NotSupported |
| nvmlDeviceGetTotalEccErrors | InvalidArgument, NotSupported |
| nvmlDeviceGetRetiredPages | InvalidArgument, InsufficientSize, NotSupported |
| nvmlDeviceGetRetiredPagesPendingStatus | InvalidArgument, NotSupported |
| nvmlDeviceGetRemappedRows | InvalidArgument, NotSupported |
| nvmlDeviceGetCurrentClocksEventReasons | InvalidArgument, NotSupported |
| nvmlDeviceGetCurrentClocksThrottleReasons | InvalidArgument, NotSupported |
| nvmlDeviceGetNvLinkState | InvalidArgument, NotSupported |
| nvmlDeviceGetNvLinkErrorCounter | InvalidArgument, NotSupported |
| nvmlDeviceGetTopologyCommonAncestor | InvalidArgument, NotSupported |
| nvmlDeviceGetP2PStatus | InvalidArgument |
| nvmlDeviceGetGpuFabricInfo | InvalidArgument, NotSupported |
| nvmlDeviceGetGpuFabricInfoV | InvalidArgument, NotSupported, ArgumentVersionMismatch |
| nvmlDeviceGetCpuAffinity | InvalidArgument, NotSupported |
| nvmlDeviceGetFieldValues | InvalidArgument |
| nvmlDeviceGetSupportedEventTypes | InvalidArgument |
| nvmlEventSetCreate | InvalidArgument |
| nvmlDeviceRegisterEvents | InvalidArgument, NotSupported |
| nvmlEventSetWait_v2 | InvalidArgument, Timeout |
| nvmlEventSetFree | (the two every row has) |

Notes on rows where the behaviour is the point:
- nvmlDeviceGetFieldValues answers SUCCESS when any value was filled; each field has
  its own `nvmlReturn` (NotSupported for a field id this GPU or driver lacks, as for
  NVML_FI_DEV_GET_GPU_RECOVERY_ACTION before R565). NVLink5 counters (Blackwell) are
  read per link (scopeId = link) or summed over the links (scopeId = 0xFFFFFFFF, as
  DCGM reads them: DcgmCacheManager.cpp, "NVLink5+ requires scopeId = UINT_MAX").
- nvmlDeviceGetProcessUtilization answers NotFound when no process has a sample in
  the buffer since `timeStamp` (an idle process is absent, not 0 %).
- nvmlDeviceGetComputeRunningProcesses / ...GraphicsRunningProcesses: pynvml sizes
  the array for twice the processes plus 5; InsufficientSize reaches the caller only
  when even more started in between (`racing`). NoPermission: aggregate information
  of a MIG GPU to an unprivileged caller.
- nvmlDeviceGetNvLinkState / ...ErrorCounter: InvalidArgument for a link number past
  the GPU's last link; NotSupported on a GPU without NVLink (and for the error
  counters on Blackwell, where NVML removed them).
- nvmlEventSetWait_v2 answers Timeout when no event arrived within `timeoutms`.
"""

from __future__ import annotations

import ctypes
import string
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any


def _documented_errors(doc: str) -> dict[str, frozenset[str]]:
    """The docstring's table: function -> the errors its row names ("(no init)" kept)."""
    rows: dict[str, frozenset[str]] = {}
    for line in doc.splitlines():
        if line.startswith("| nvml"):
            name, errors = (cell.strip() for cell in line.strip().strip("|").split("|"))
            rows[name] = frozenset(e.strip() for e in errors.split(","))
    return rows


# Function -> the errors the NVML reference documents for it (the docstring's table).
DOCUMENTED_ERRORS = _documented_errors(__doc__ or "")
NO_INIT = "(no init)"
# The two every row has (see the module docstring).
EVERY_ROW = frozenset({"Uninitialized", "GpuIsLost"})
# A field value summed over a GPU's NVLinks (NVLink5: scopeId = UINT_MAX).
ALL_LINKS = 0xFFFFFFFF

ERROR_CODES = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8, "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12, "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15, "RESET_REQUIRED": 16, "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20, "NO_DATA": 21,
    "VGPU_ECC_NOT_SUPPORTED": 22, "INSUFFICIENT_RESOURCES": 23, "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25, "DEPRECATED": 26, "NOT_READY": 27, "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29, "RESET_TYPE_NOT_SUPPORTED": 30, "UNKNOWN": 999,
}
# NVMLError._errcode_to_string of pynvml (codes it lacks print as "NVML Error with code N").
ERROR_STRINGS = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 5: "Already Initialized", 6: "Not Found",
    7: "Insufficient Size", 8: "Insufficient External Power", 9: "Driver Not Loaded",
    10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost",
    16: "GPU requires restart", 17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.", 20: "Insufficient Memory",
    999: "Unknown Error",
}
# The pynvml constants gpucheck reads (the fake answers nothing else).
CONSTANTS = {
    "NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1,
    "NVML_NVLINK_MAX_LINKS": 36, "NVML_P2P_CAPS_INDEX_NVLINK": 2, "NVML_P2P_STATUS_OK": 0,
    "nvmlMemory_v2": 0x2000028, "NVML_SUCCESS": 0, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": 0,
    "NVML_GPU_FABRIC_STATE_COMPLETED": 3, "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "nvmlGpuFabricInfo_v2": 0x2000024,
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1, "NVML_NVLINK_ERROR_DL_REPLAY": 0,
    "NVML_NVLINK_ERROR_DL_RECOVERY": 1, "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2,
    "NVML_NVLINK_ERROR_DL_CRC_DATA": 3, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP": 74,
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": 269,
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": 270,
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": 271,
    "nvmlEventTypeSingleBitEccError": 0x1, "nvmlEventTypeDoubleBitEccError": 0x2,
    "nvmlEventTypeXidCriticalError": 0x8, "nvmlEventTypeSingleBitEccErrorStorm": 0x200,
    "nvmlEventTypeDramRetirementEvent": 0x400, "nvmlEventTypeDramRetirementFailure": 0x800,
    "nvmlEventTypeNonFatalPoisonError": 0x1000, "nvmlEventTypeFatalPoisonError": 0x2000,
    "nvmlEventTypeGpuUnavailableError": 0x4000, "nvmlEventTypeGpuRecoveryAction": 0x8000,
    "NVML_GPU_RECOVERY_ACTION_NONE": 0, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
    "nvmlGpuFabricInfo_v3": 0x3000028, "NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE": 1,
    "NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE": 1,
    "NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY": 2,
    "NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY": 3,
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS": 215,
    "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS": 219,
    "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER": 220, "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS": 221,
    "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER": 222, "NVML_FI_DEV_ACTIVE_BANK_REMAPPINGS": 303,
    "NVML_FI_DEV_INACTIVE_BANK_REMAPPINGS": 304, "NVML_FI_DEV_PENDING_BANK_REMAPPING": 307,
    **{f"NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_{b}": 235 + b for b in range(16)},
}
# What an H100/H200 answers to nvmlDeviceGetSupportedEventTypes (no storm, no poison).
H200_EVENT_TYPES = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x80 | 0x100
# Clock-event reason time counters (ns) a recent driver answers; other field ids: NotSupported.
SLOWDOWN_FIELD_IDS = (74, 269, 270, 271)
# A packed BER of zero (mantissa 15, exponent 255: DCGM's "BER zero"); and a GPU's
# NVLink5 counters and bank remapper when healthy (what a B200 answers; an H200 answers
# NotSupported for every one of these field ids).
BER_ZERO = 15 << 8 | 255
NVLINK5_HEALTHY: dict[int | tuple[int, int], int] = {
    **{(field_id, ALL_LINKS): 0 for field_id in (215, 219, 221, *range(235, 251))},
    (220, ALL_LINKS): BER_ZERO, (222, ALL_LINKS): BER_ZERO}
BANKS_HEALTHY: dict[int | tuple[int, int], int] = {303: 0, 304: 0, 307: 0}
FABRIC_COMPLETED_OK = (3, 0)  # (NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)
# A healthy NVSwitch GPU's healthMask: bandwidth not degraded, no route recovery, routes
# healthy, no access-timeout recovery (each _FALSE = 2), configuration NONE (1); the
# partition and global-fabric-manager fields not supported (0), as on a single HGX node.
HEALTHY_FABRIC_MASK = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8
# Fabric struct versions a current driver's nvmlDeviceGetGpuFabricInfoV accepts.
FABRIC_VERSIONS = frozenset({0x02000024, 0x3000028})


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """As pynvml: the unversioned struct of nvmlDeviceGetGpuFabricInfo (deprecated)."""

    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    """As pynvml: the v2 struct of nvmlDeviceGetGpuFabricInfoV; __init__ sets its version."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=CONSTANTS["nvmlGpuFabricInfo_v2"])


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    """As pynvml: the v3 struct (adds healthSummary); __init__ sets its version."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32),
                ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=CONSTANTS["nvmlGpuFabricInfo_v3"])


class c_nvmlValue_t(ctypes.Union):
    """As pynvml: the value union of a field value."""

    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class c_nvmlFieldValue_t(ctypes.Structure):
    """As pynvml: one entry of nvmlDeviceGetFieldValues' answer (its own nvmlReturn)."""

    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32),
                ("timestamp", ctypes.c_int64), ("latencyUsec", ctypes.c_int64),
                ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", c_nvmlValue_t)]


class c_nvmlEventData_t(ctypes.Structure):
    """As pynvml: what nvmlEventSetWait_v2 returns (`device` is an opaque pointer)."""

    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


# Structs pynvml builds and returns; their nested types are pynvml's own classes, so
# tests compare them by field names, offsets and sizes rather than by `_fields_`.
RETURNED_STRUCTS = {"c_nvmlFieldValue_t": c_nvmlFieldValue_t,
                    "c_nvmlEventData_t": c_nvmlEventData_t, "c_nvmlValue_t": c_nvmlValue_t}
STRUCTS = {"c_nvmlGpuFabricInfo_t": c_nvmlGpuFabricInfo_t,
           "c_nvmlGpuFabricInfo_v2_t": c_nvmlGpuFabricInfo_v2_t,
           "c_nvmlGpuFabricInfoV_t": c_nvmlGpuFabricInfo_v2_t,
           "c_nvmlGpuFabricInfo_v3_t": c_nvmlGpuFabricInfo_v3_t}


def _struct(arg: Any) -> Any:
    """The structure behind byref(s) or pointer(s).

    pynvml hands this argument to C as is, so a bare structure would be passed by
    value where C expects a pointer: callers must pass byref(s). Refuse anything else.
    """
    if hasattr(arg, "_obj"):
        return arg._obj
    if hasattr(arg, "contents"):
        return arg.contents
    raise TypeError("pass ctypes.byref(struct): pynvml hands the argument to C as is")
H200_MEMORY = 150_754_820_096


@dataclass
class FakeGpu:
    """One simulated GPU: healthy H200 defaults; set fields to inject faults."""

    name: str = "NVIDIA H200"
    bus_id: str = "00000000:18:00.0"
    memory_used: int = 1_048_576 * 600
    cc: tuple[int, int] = (9, 0)
    persistence: int = 1
    mig: list[int] | None = field(default_factory=lambda: [0, 0])
    temperature: int = 34
    power_mw: int = 72_000
    power_limit_mw: int = 700_000
    power_default_limit_mw: int = 700_000  # nvmlDeviceGetPowerManagementDefaultLimit
    sm_clock: int = 345
    sm_clock_max: int = 1980
    util: tuple[int, int] = (0, 0)
    pids: list[int] = field(default_factory=list)
    # nvmlDeviceGetProcessUtilization: pid -> SM utilisation % (or (%, sample time in
    # microseconds)); no non-zero sample newer than the call's timestamp answers
    # NotFound, as NVML does.
    proc_util: dict[int, int | tuple[int, int]] = field(default_factory=dict)
    pcie_gen: tuple[int, int] = (1, 5)
    pcie_width: tuple[int, int] = (16, 16)
    ecc_mode: list[int] = field(default_factory=lambda: [1, 1])
    ecc_volatile_unc: int = 0
    ecc_aggregate_unc: int = 0
    ecc_volatile_cor: int = 0
    ecc_aggregate_cor: int = 0
    retired_pending: int = 0
    # Retired page addresses per NVML_PAGE_RETIREMENT_CAUSE_* (0: multiple SBE, 1: DBE).
    retired_pages: dict[int, list[int]] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    clock_reasons: int = 0x1
    # Masks the clock-event reason calls answer first, one per call; then `clock_reasons`.
    clock_reasons_seq: list[int] = field(default_factory=list)
    pcie_replays: int = 0
    nvlinks: int = 18
    nvlinks_down: set[int] = field(default_factory=set)  # links whose state reads 0
    # (link, NVML_NVLINK_ERROR_DL_*) -> count; absent pairs read 0.
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    # nvmlDeviceGetFieldValues: field id, or (field id, scopeId), -> value (ULL); a
    # (field, scope) pair wins over the bare id; other ids answer NotSupported.
    field_values: dict[int | tuple[int, int], int] = field(
        default_factory=lambda: dict.fromkeys(SLOWDOWN_FIELD_IDS, 0))
    # Field id -> share of wall time since the fake was made that its counter (ns) grows
    # by: a clock-event reason held that share of any window (added to field_values).
    slowdown_share: dict[int, float] = field(default_factory=dict)
    event_types: int = H200_EVENT_TYPES
    # (state, status) of nvmlDeviceGetGpuFabricInfo*; None: the GPU has no fabric (NotSupported).
    fabric: tuple[int, int] | None = FABRIC_COMPLETED_OK
    # healthMask and healthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*) of a registered fabric.
    fabric_health: int = HEALTHY_FABRIC_MASK
    fabric_summary: int = 1
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (NVML_GPU_RECOVERY_ACTION_*); None: a driver
    # before R565, which answers NotSupported for the field.
    recovery_action: int | None = 0
    # Blackwell: NVML answers NotSupported for nvmlDeviceGetNvLinkErrorCounter and the
    # NVML_FI_DEV_NVLINK_ERROR_DL_* field ids (removed there; see `blackwell_gpu`).
    nvlink_error_counters: bool = True
    # nvmlDeviceGetCpuAffinity: the CPUs near the GPU (`nvidia-smi topo -m` "CPU Affinity").
    cpu_affinity: tuple[int, ...] = tuple(range(8))
    # Seconds the first nvmlDeviceGetHandleByIndex after nvmlInit takes (GPU bring-up).
    first_attach_s: float = 0.0
    lost: bool = False
    # Functions that answer NotSupported, NoPermission or InsufficientSize on this GPU
    # (only where the reference documents that error: see the module docstring).
    unsupported: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)
    racing: set[str] = field(default_factory=set)
    hang: set[str] = field(default_factory=set)


def blackwell_gpu(**fields: Any) -> FakeGpu:
    """A B200 as NVML >= R565 shows it: compute capability 10.0, 18 NVLinks up,
    NotSupported for the NVLink error counters NVML removed on Blackwell, and the
    NVLink5 counters and bank remapper in their place (field values, all healthy)."""
    values = {**dict.fromkeys(SLOWDOWN_FIELD_IDS, 0), **NVLINK5_HEALTHY, **BANKS_HEALTHY}
    return FakeGpu(**{"name": "NVIDIA B200", "cc": (10, 0), "nvlinks": 18,
                      "nvlink_error_counters": False, "field_values": values, **fields})


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class _EventSet:
    """An nvmlEventSet_t: per GPU index the registered type mask, and a queue."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self.queue: deque[c_nvmlEventData_t] = deque()
        self.ready = threading.Condition()
        self.freed = False


def _bus_key(bus_id: str) -> str:
    """NVML takes "0000:9a:00.0" and "00000000:9A:00.0" alike."""
    domain, rest = bus_id.strip().upper().split(":", 1)
    return f"{int(domain, 16):08X}:{rest}"


def _error_classes(module: types.ModuleType) -> None:
    """The NVMLError hierarchy exactly as pynvml builds it."""

    class NVMLError(Exception):
        _valClassMapping: dict[int, type] = {}  # noqa: RUF012

        def __new__(cls, value: int) -> Any:
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj

        def __str__(self) -> str:
            return ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

        def __eq__(self, other: object) -> bool:
            return self.value == getattr(other, "value", None)

        __hash__ = Exception.__hash__

    module.NVMLError = NVMLError
    for name, value in ERROR_CODES.items():
        class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")

        def new(cls: type, *args: Any, _value: int = value) -> Any:
            return NVMLError.__new__(cls, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        setattr(module, class_name, cls)
        setattr(module, f"NVML_ERROR_{name}", value)
        NVMLError._valClassMapping[value] = cls


class FakeNvml:
    """State behind the fake module's functions."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "550.54.15",
                 cuda_driver: int = 12040, init_error: str | None = None,
                 topology: int = 40, absent: frozenset[str] = frozenset(),
                 hang_s: float = 30.0, fabric_versions: frozenset[int] = FABRIC_VERSIONS) -> None:
        """`absent`: functions this driver's libnvidia-ml lacks (pynvml raises
        FunctionNotFound); `hang_s`: how long a call in `FakeGpu.hang` blocks;
        `fabric_versions`: the fabric struct versions this driver knows."""
        self.gpus, self.driver, self.cuda_driver = gpus, driver, cuda_driver
        self.init_error, self.topology, self.init_count = init_error, topology, 0
        self.born_ns = time.monotonic_ns()  # the clock `FakeGpu.slowdown_share` grows on
        self.absent, self.hang_s, self.attached = absent, hang_s, set()
        self.fabric_versions = fabric_versions
        # A hung call blocks until `release()` or `hang_s`; `hangs` counts those that
        # began and `hangs_ended` those that came back (a test asks whether gpucheck
        # returned while one was still blocked).
        self._released = threading.Event()
        self.hangs, self.hangs_ended = 0, 0
        # Per GPU pair (NVML indices, either order): the NVML_TOPOLOGY_* level, and the
        # NVML_P2P_STATUS_* per (pair, NVML_P2P_CAPS_INDEX_*); others as above.
        self.topology_pairs: dict[frozenset[int], int] = {}
        self.p2p_pairs: dict[tuple[frozenset[int], int], int] = {}
        self.event_sets: list[_EventSet] = []
        self.module = types.ModuleType("pynvml")
        _error_classes(self.module)
        for key, value in {**CONSTANTS, **STRUCTS}.items():
            setattr(self.module, key, value)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(self.module, name, getattr(self, name))

    def _raise(self, name: str) -> None:
        # As pynvml: NVMLError_<Name>() carries its own code.
        raise getattr(self.module, f"NVMLError_{name}")()

    @property
    def initialised(self) -> bool:
        return self.init_count > 0

    def _injected(self, gpu: FakeGpu, fn: str) -> None:
        """Raise the error a test injected for `fn` on this GPU, if the reference
        documents it for `fn`; an undocumented one is the test's mistake."""
        for injected, error in ((gpu.unsupported, "NotSupported"), (gpu.denied, "NoPermission"),
                                (gpu.racing, "InsufficientSize")):
            if fn in injected:
                assert error in DOCUMENTED_ERRORS.get(fn, ()), (
                    f"NVML does not document {error} for {fn}: see tests/fake_pynvml.py")
                self._raise(error)

    def _hang(self) -> None:
        self.hangs += 1
        self._released.wait(self.hang_s)
        self.hangs_ended += 1

    def release(self) -> None:
        """End every hung call now (a test's clean-up)."""
        self._released.set()

    def _gpu(self, handle: _Handle, fn: str) -> FakeGpu:
        if fn in self.absent:
            self._raise("FunctionNotFound")
        if not self.initialised:
            self._raise("Uninitialized")
        gpu = self.gpus[handle.index]
        if fn in gpu.hang:
            self._hang()
        if gpu.lost:
            self._raise("GpuIsLost")
        self._injected(gpu, fn)
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error:
            raise getattr(self.module, self.init_error)(0)
        self.init_count += 1  # NVML counts nvmlInit calls; nvmlShutdown undoes one

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            self._raise("Uninitialized")
        self.init_count -= 1
        if not self.init_count:
            # Without persistence mode the driver tears the GPUs down with the last client.
            self.attached = set()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda_driver

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not self.initialised:
            self._raise("Uninitialized")
        if index >= len(self.gpus):
            self._raise("InvalidArgument")
        gpu = self.gpus[index]
        if "nvmlDeviceGetHandleByIndex" in gpu.hang:
            self._hang()
        if index not in self.attached:
            time.sleep(gpu.first_attach_s)  # NVML brings the GPU up on its first attach
            self.attached.add(index)
        if gpu.lost:
            self._raise("GpuIsLost")
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> bytes:  # older releases return bytes
        self._gpu(handle, "nvmlDeviceGetUUID")
        return f"GPU-{handle.index:08d}-0000-0000-0000-000000000000".encode()

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return types.SimpleNamespace(busId=gpu.bus_id.encode(), busIdLegacy=gpu.bus_id[4:])

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mem = types.SimpleNamespace(total=H200_MEMORY, used=gpu.memory_used,
                                    free=H200_MEMORY - gpu.memory_used)
        if version:
            mem.version, mem.reserved = version, 512 * 1_048_576
        return mem

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").cc

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPersistenceMode").persistence

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if gpu.mig is None:
            self._raise("NotSupported")
        return list(gpu.mig or [])

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        return gpu.power_default_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetClockInfo").sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, type: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxClockInfo").sm_clock_max

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=2 << 30, gpuInstanceId=0xFFFFFFFF,
                                      computeInstanceId=0xFFFFFFFF) for pid in gpu.pids]

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[Any]:
        # NVML: one sample per process with non-zero utilisation in the last sample
        # period, only samples newer than timeStamp (lastSeenTimeStamp, CPU time in
        # microseconds), NotFound when none is left. A `proc_util` value is the SM %
        # sampled now, or (SM %, sample time in microseconds).
        gpu = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        now_us = int(time.time() * 1e6)
        samples = []
        for pid, value in gpu.proc_util.items():
            util, at_us = value if isinstance(value, tuple) else (value, now_us)
            if util > 0 and at_us > timeStamp:
                samples.append(types.SimpleNamespace(pid=pid, timeStamp=at_us, smUtil=util,
                                                     memUtil=util // 2, encUtil=0, decUtil=0))
        if not samples:
            self._raise("NotFound")
        return samples

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width[1]

    def nvmlDeviceGetEccMode(self, handle: _Handle) -> list[int]:
        return list(self._gpu(handle, "nvmlDeviceGetEccMode").ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int,
                                    counterType: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType != 1:
            return gpu.ecc_volatile_cor if counterType == 0 else gpu.ecc_aggregate_cor
        return gpu.ecc_volatile_unc if counterType == 0 else gpu.ecc_aggregate_unc

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: _Handle) -> int:
        return self._gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped

    @staticmethod
    def _reasons(gpu: FakeGpu) -> int:
        return gpu.clock_reasons_seq.pop(0) if gpu.clock_reasons_seq else gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._reasons(self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._reasons(self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons"))

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if link >= gpu.nvlinks:
            self._raise("NotSupported" if gpu.nvlinks == 0 else "InvalidArgument")
        return 0 if link in gpu.nvlinks_down else 1

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        self._gpu(device1, "nvmlDeviceGetTopologyCommonAncestor")
        self._gpu(device2, "nvmlDeviceGetTopologyCommonAncestor")
        return self.topology_pairs.get(frozenset((device1.index, device2.index)),
                                       self.topology)

    def _fabric(self, device: _Handle, fn: str, info: Any) -> int:
        gpu = self._gpu(device, fn)
        if gpu.fabric is None:
            self._raise("NotSupported")
        info.state, info.status = gpu.fabric
        if gpu.fabric[0] == CONSTANTS["NVML_GPU_FABRIC_STATE_COMPLETED"]:
            info.cliqueId = 1
        supported = gpu.fabric[0] != CONSTANTS["NVML_GPU_FABRIC_STATE_NOT_SUPPORTED"]
        if hasattr(info, "healthMask"):  # v2 and v3; 0: every field not supported
            info.healthMask = gpu.fabric_health if supported else 0
        if hasattr(info, "healthSummary"):  # v3
            info.healthSummary = gpu.fabric_summary if supported else 0
        return CONSTANTS["NVML_SUCCESS"]

    def nvmlDeviceGetGpuFabricInfo(self, device: _Handle, gpuFabricInfo: Any) -> int:
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfo", _struct(gpuFabricInfo))

    def nvmlDeviceGetGpuFabricInfoV(self, device: _Handle, gpuFabricInfo: Any) -> int:
        info = _struct(gpuFabricInfo)
        if getattr(info, "version", None) not in self.fabric_versions:
            self._raise("ArgumentVersionMismatch")
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfoV", info)

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpuSetSize: int) -> Any:
        """As pynvml: a (c_ulonglong * cpuSetSize) bitmask, CPU 64*i+b in word i bit b;
        CPUs past cpuSetSize words are left out, as NVML does."""
        gpu = self._gpu(handle, "nvmlDeviceGetCpuAffinity")
        mask = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in gpu.cpu_affinity:
            if cpu // 64 < cpuSetSize:
                mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    def nvmlDeviceGetP2PStatus(self, device1: _Handle, device2: _Handle,
                               p2pIndex: int) -> int:
        a = self._gpu(device1, "nvmlDeviceGetP2PStatus")
        b = self._gpu(device2, "nvmlDeviceGetP2PStatus")
        pair = frozenset((device1.index, device2.index))
        if (pair, p2pIndex) in self.p2p_pairs:
            return self.p2p_pairs[(pair, p2pIndex)]
        return 0 if a.nvlinks and b.nvlinks else 5

    # -- fault counters (gpucheck.faults) --------------------------------------------

    def _check(self, fn: str) -> None:
        if fn in self.absent:
            self._raise("FunctionNotFound")
        if not self.initialised:
            self._raise("Uninitialized")

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str) -> _Handle:
        self._check("nvmlDeviceGetHandleByPciBusId")
        for index, gpu in enumerate(self.gpus):
            if _bus_key(gpu.bus_id) == _bus_key(pciBusId):
                if index not in self.attached:
                    time.sleep(gpu.first_attach_s)
                    self.attached.add(index)
                if gpu.lost:
                    self._raise("GpuIsLost")
                return _Handle(index)
        self._raise("NotFound")
        raise AssertionError("unreachable")

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetRetiredPages(self, device: _Handle, sourceFilter: int) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetRetiredPages")
        return list(gpu.retired_pages.get(sourceFilter, []))

    def nvmlDeviceGetNvLinkErrorCounter(self, device: _Handle, link: int, counter: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkErrorCounter")
        if not gpu.nvlink_error_counters:
            self._raise("NotSupported")
        if link >= gpu.nvlinks:
            self._raise("NotSupported" if gpu.nvlinks == 0 else "InvalidArgument")
        return gpu.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, fieldIds: list[Any]) -> Any:
        """As pynvml: an array of c_nvmlFieldValue_t, each with its own nvmlReturn."""
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        if not fieldIds:
            self._raise("InvalidArgument")  # valuesCount 0 (cuda-python notes it)
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        for value, field_id in zip(values, fieldIds, strict=True):
            value.fieldId, value.scopeId = (field_id if isinstance(field_id, tuple)
                                            else (field_id, 0))
            value.timestamp = time.time_ns() // 1000
            if value.fieldId == CONSTANTS["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"] \
                    and gpu.recovery_action is not None:
                value.valueType = CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_INT"]
                value.value.uiVal = gpu.recovery_action
                continue
            found = self._field(gpu, value.fieldId, value.scopeId)
            if found is None:
                value.nvmlReturn = ERROR_CODES["NOT_SUPPORTED"]
            else:
                value.valueType = CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_LONG_LONG"]
                value.value.ullVal = found
        return values

    def _field(self, gpu: FakeGpu, field_id: int, scope: int) -> int | None:
        """A field's value at `scope` (a scoped entry wins), None when not supported; a
        slowdown counter grows by its share of the time since the fake was made."""
        value = gpu.field_values.get((field_id, scope), gpu.field_values.get(field_id))
        share = gpu.slowdown_share.get(field_id)
        if share is not None:
            value = (value or 0) + int(share * (time.monotonic_ns() - self.born_ns))
        return value

    # -- events ----------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").event_types

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int,
                                 eventSet: _EventSet) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~gpu.event_types:  # NVML refuses the whole call
            self._raise("NotSupported")
        eventSet.masks[handle.index] = eventSet.masks.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: _EventSet, timeoutms: int) -> c_nvmlEventData_t:
        """The next queued event, waiting up to `timeoutms`; NVMLError_Timeout when none."""
        self._check("nvmlEventSetWait_v2")
        if eventSet.freed:
            self._raise("InvalidArgument")
        with eventSet.ready:
            if not eventSet.queue:
                eventSet.ready.wait(timeoutms / 1000.0)
            if eventSet.queue:
                return eventSet.queue.popleft()
        self._raise("Timeout")
        raise AssertionError("unreachable")

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._check("nvmlEventSetFree")
        eventSet.freed = True

    def deliver_event(self, index: int, event_type: int, data: int = 0) -> int:
        """The driver raises an event on GPU `index` (an XID: `data` is its number);
        queued in every live set registered for it. Returns how many sets got it."""
        delivered = 0
        for event_set in self.event_sets:
            if event_set.freed or not event_set.masks.get(index, 0) & event_type:
                continue
            with event_set.ready:
                event_set.queue.append(c_nvmlEventData_t(
                    device=index + 1, eventType=event_type, eventData=data,
                    gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))
                event_set.ready.notify_all()
            delivered += 1
        return delivered


# --- what the NVML tests share ---

def gpus(n: int, **fields: Any) -> list[FakeGpu]:
    """`n` GPUs on distinct buses (00000000:18:00.0, 00000000:28:00.0, ...), each with `fields`."""
    return [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", **fields) for i in range(n)]


def probe(monkeypatch: Any, fake: FakeNvml, nvml: Any = None, sysfs: Any = None,
          environ: Any = None) -> Any:
    """`probe_nvml` with `fake` as pynvml (a 2 s budget unless `nvml` is given)."""
    from gpucheck.probes.gpus import probe_nvml
    from gpucheck.probes.nvml import Nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return probe_nvml(nvml or Nvml(2.0), sysfs, environ)


def findings(result: Any, check: str, status: Any = None) -> list[Any]:
    """The findings of `check` in a probe result (of `status`, when given)."""
    found = [f for s in result.sections for f in s.findings if f.check == check]
    return [f for f in found if status is None or f.status is status]
