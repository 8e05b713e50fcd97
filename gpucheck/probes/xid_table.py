"""What each NVIDIA XID means, how bad it is for the GPU, and what to do: NVIDIA's Xid
catalog (CATALOG_URL, read CATALOG_READ) with its Resolution Bucket in gpucheck's actions;
docs/xid.md gives the mapping, the two departures and why."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import NamedTuple

from gpucheck.checks import ACTIONS as ACTIONS  # the fixed list every finding uses

SEVERITIES = ("info", "warn", "fail")
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_READ = "2026-11-24"


@dataclass(frozen=True)
class XidInfo:
    """One XID: its meaning, its severity for the GPU, the action, and the advice."""

    xid: int
    meaning: str
    severity: str  # one of SEVERITIES
    action: str  # one of ACTIONS
    advice: str  # what a person should do, in one sentence
    bucket: str = ""  # the catalog's Resolution Bucket (Immediate Action); "" unknown


_APP = "the application's own fault on a healthy GPU: fix or restart the program"
_ENGINE = ("restart the application that used this engine; the GPU needs no reset "
           "(NVIDIA's catalog); contact support if it recurs with known-good programs")
_RESET = "reset the GPU (nvidia-smi -r -i <index>) before using it again"
_IGNORE = "no action needed (NVIDIA's catalog: IGNORE)"
_NVL5 = ("NVLink error on a Blackwell GPU: Fatal or Nonfatal is in the kernel-log line "
         "(gpucheck env reads it); a fatal one needs a GPU reset")


def _x(xid: int, meaning: str, bucket: str, severity: str, action: str,
       advice: str) -> XidInfo:
    return XidInfo(xid, meaning, severity, action, advice, bucket)


_ENGINES = {39: "CE0", 40: "CE1", 41: "CE2", 60: "Video processor", 68: "NVDEC0",
            70: "CE3", 71: "CE4", 72: "CE5", 75: "CE6", 76: "CE7", 77: "CE8", 82: "NVJPG0",
            83: "NVDEC1", 84: "NVDEC2", 85: "CE9", 86: "OFA", 88: "NVDEC3", 89: "NVDEC4",
            96: "NVDEC5", 97: "NVDEC6", 98: "NVDEC7", 99: "NVJPG1", 100: "NVJPG2",
            101: "NVJPG3", 102: "NVJPG4", 103: "NVJPG5", 104: "NVJPG6", 105: "NVJPG7",
            139: "OFA1", **{126 + i: f"CE{10 + i}" for i in range(10)}}
_NVLINK5 = {144: "SAW", 145: "RLW", 146: "TLW", 147: "TREX", 148: "NVLPW_CTRL",
            149: "NETIR", 150: "MSE"}

XID_TABLE: dict[int, XidInfo] = {info.xid: info for info in (
    _x(8, "GPU stopped processing (channel idle timeout)", "RESTART_APP", "warn",
       "restart-app", "restart the application; if it recurs with no application at fault, "
       "reset the GPU"),
    _x(11, "Invalid or corrupted push buffer stream", "RESTART_APP", "info", "restart-app",
       f"{_APP} (it passed bad data to the GPU: the catalog's CHECK_APP/CUDA)"),
    _x(13, "Graphics Engine Exception", "RESTART_APP", "info", "restart-app",
       f"{_APP} (often an out-of-range access or an illegal instruction in a kernel)"),
    _x(14, "Fake or injected error", "IGNORE", "info", "none", f"{_IGNORE}: injected from "
       "user space"),
    _x(25, "Invalid or illegal push buffer stream", "RESTART_APP", "info", "restart-app",
       f"{_APP} (the catalog's CHECK_APP/CUDA)"),
    _x(31, "GPU memory page fault", "RESTART_APP", "info", "restart-app",
       f"{_APP} (an illegal memory address, as compute-sanitizer would show)"),
    _x(32, "Invalid or corrupted push buffer stream", "RESTART_APP", "warn", "restart-app",
       "restart the application; repeated ones point at the PCIe bus (the catalog: "
       "'primarily quality issues on PCI')"),
    _x(37, "Driver firmware error", "IGNORE", "info", "none", _IGNORE),
    _x(38, "Driver firmware error", "IGNORE", "info", "none", _IGNORE),
    _x(43, "GPU stopped processing", "IGNORE", "info", "none",
       f"{_APP} (the driver stopped a channel that faulted; the GPU stays healthy)"),
    _x(44, "Graphics Engine fault during context switch", "IGNORE", "info", "none", _IGNORE),
    _x(45, "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", "info", "none",
       "the driver cleaned up after an earlier error or a killed program: follow the XIDs "
       "before it"),
    _x(46, "GPU stopped processing", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(48, "Double bit ECC error (uncorrectable memory error)", "WORKFLOW_XID_48", "fail",
       "reset-gpu", f"{_RESET}; with an XID 63/64 on the same GPU, drain the node first"),
    _x(54, "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "fail",
       "replace-hardware", "check the GPU's seating and its power connectors"),
    _x(62, "Internal micro-controller halt", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(63, "ECC page retirement or row remapping recording event", "IGNORE", "warn",
       "reset-gpu", "a bad memory row was recorded: reset the GPU when it is idle so the "
       "retirement or remap takes effect"),
    _x(64, "ECC page retirement or row remapper recording failure", "RESET_GPU", "fail",
       "replace-hardware", "the GPU could not retire a bad memory page or remap a row: "
       "drain the node and replace the GPU"),
    _x(66, "Illegal access by driver", "IGNORE", "info", "none", _IGNORE),
    _x(67, "Illegal access by driver", "IGNORE", "info", "none", _IGNORE),
    _x(69, "Graphics Engine class error", "RESTART_APP", "info", "restart-app", _APP),
    _x(74, "NVLink error", "WORKFLOW_NVLINK_ERR", "fail", "reset-gpu",
       "reset the GPU (with its NVLink peers) and check the links with nvidia-smi nvlink "
       "-s; drain the node and replace hardware if it recurs"),
    _x(78, "vGPU start error", "UPDATE_SWFW", "warn", "fix-config",
       "update the host and guest drivers to matching versions"),
    _x(79, "GPU has fallen off the bus", "RESTART_BM", "fail", "drain-node",
       "the GPU is gone from the PCIe bus: drain the node and reboot it; check power, "
       "cooling and seating, and replace the GPU if it happens again"),
    _x(80, "Corrupted data sent to GPU", "RESTART_APP", "warn", "restart-app",
       "restart the application; repeated ones point at the PCIe bus"),
    _x(92, "High single-bit ECC error rate", "IGNORE", "info", "none",
       "the errors were corrected; the ECC counters (nvidia-smi -q -d ECC) say more"),
    _x(93, "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE", "info", "none",
       f"{_IGNORE}; nvflash --elsessionclear clears the limit"),
    _x(94, "Contained ECC error", "RESTART_APP", "warn", "restart-app",
       "only the applications using the bad memory were stopped: restart them; reset "
       "the GPU when it is idle to remap the row"),
    _x(95, "Uncontained ECC error", "RESET_GPU", "fail", "reset-gpu",
       "every application on this GPU is affected: drain the node and reset the GPU "
       "before using it again"),
    _x(106, "SMBPBI test message", "IGNORE", "info", "none", _IGNORE),
    _x(107, "SMBPBI test message (silent)", "IGNORE", "info", "none", _IGNORE),
    _x(108, "NVLink remote translation error", "IGNORE", "info", "none", _IGNORE),
    _x(109, "Context switch timeout", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(110, "Security fault error", "RESET_GPU", "fail", "reset-gpu",
       f"{_RESET}; revert recent hardware changes if it recurs"),
    _x(119, "GSP RPC timeout", "RESET_GPU", "fail", "reset-gpu",
       "the GPU System Processor stopped answering: reset the GPU (or power-cycle the "
       "node) before using it again"),
    _x(120, "GSP error", "RESET_GPU", "fail", "reset-gpu",
       "the GPU System Processor failed: reset the GPU (or power-cycle the node) before "
       "using it again"),
    _x(121, "C2C (Grace-to-GPU link) corrected error", "IGNORE", "info", "none",
       f"{_IGNORE}: corrected; reset the GPU in a service window to retrain the link"),
    _x(136, "NVLink link training failed", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(137, "NVLink privilege error (illegal peer access)", "IGNORE", "info", "none",
       f"{_APP} (an illegal NVLink peer access: the catalog's XID_137_FLOW)"),
    _x(140, "ECC unrecovered error", "RESET_GPU", "fail", "reset-gpu",
       f"{_RESET}; replace it if it happens again"),
    _x(141, "CUDA fast path error", "IGNORE", "info", "none", _IGNORE),
    _x(143, "GPU initialization error", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(151, "Key rotation error", "RESTART_VM", "warn", "restart-app",
       "restart the VM that owns the GPU"),
    _x(154, "GPU recovery action changed", "XID_154", "warn", "reset-gpu",
       "the driver asks for a recovery: its kernel-log line (or nvidia-smi -q, 'GPU "
       "Recovery Action') says which; every one but None needs at least a GPU reset"),
    _x(155, "NVLink software-defined error (intentional link down)", "RESET_GPU", "warn",
       "reset-gpu", "a link was taken down on purpose (or to sleep): reset the GPU; "
       "find who did it if it was not expected"),
    _x(156, "Resource retirement event", "RESET_GPU", "warn", "reset-gpu",
       "a resource was retired: reset the GPU when it is idle so it takes effect"),
    _x(157, "Resource retirement failure", "IGNORE", "info", "none",
       f"{_IGNORE}: no repair was possible; the same XID may come back"),
    _x(158, "GPU fatal timeout", "RESET_GPU", "fail", "reset-gpu", _RESET),
    _x(159, "CHI non-data error (C2C link)", "CHECK_UVM", "warn", "reset-gpu",
       "reset the GPU if UVM or vGPU is in use; otherwise nothing to do (the catalog)"),
    _x(160, "Channel retirement event", "IGNORE", "info", "none", _IGNORE),
    _x(161, "Channel retirement failure", "IGNORE", "info", "none", _IGNORE),
    *(_x(x, f"{unit} exception", "RESTART_APP", "warn", "restart-app", _ENGINE)
      for x, unit in _ENGINES.items()),
    *(_x(x, f"NVLink {unit} error", "WORKFLOW_NVLINK5_ERR", "warn", "reset-gpu", _NVL5)
      for x, unit in _NVLINK5.items()),
)}


class Recovery(NamedTuple):
    """One nvmlDeviceGpuRecoveryAction_t value: what the driver asks, our action, and
    gpu.recovery_action's verdict on it (FAIL or WARN, meaning, what to do)."""

    name: str  # NVML_GPU_RECOVERY_ACTION_<NAME>, lower case: the GPU record's word
    what: str
    action: str  # one of ACTIONS
    fails: bool
    meaning: str
    todo: str  # "{index}": the GPU's NVML index


_RESET_IT = "stop every process on it, then reset it: nvidia-smi -r -i {index}"
# The one table of NVML's recovery actions, which XID 154 announces, NVML's event carries
# and `nvidia-smi -q` shows (NVIDIA's GPU memory error management guide: Drain P2P =
# quiesce peer-to-peer traffic, then query again; Drain and Reset = drain, then reset).
RECOVERY_ACTIONS: dict[int, Recovery] = {
    1: Recovery("gpu_reset", "GPU reset", "reset-gpu", True,
                "the GPU hit a fault that only a GPU reset clears", _RESET_IT),
    2: Recovery("node_reboot", "node reboot", "drain-node", True,
                "the fault may have left the OS in an inconsistent state",
                "drain the node and reboot it"),
    3: Recovery("drain_p2p", "drain peer-to-peer traffic", "drain-node", True,
                "peer-to-peer traffic must be quiesced before NVML can say more",
                "stop every process doing peer-to-peer (NVLink/NCCL) traffic on it and "
                "turn off UVM persistence mode, then run gpucheck env again: NVML then "
                "names the next action"),
    4: Recovery("drain_and_reset", "drain and reset", "drain-node", False,
                "the GPU keeps working, possibly at reduced capacity, but NVIDIA recommends "
                "draining it and resetting it", "drain the node (let running work finish, "
                "start nothing new), then reset the GPU: nvidia-smi -r -i {index}"),
    5: Recovery("recover_imex_domain", "recover the IMEX domain", "drain-node", True,
                "the IMEX domain (memory shared over multi-node NVLink) must be recovered",
                "drain the node and recover the IMEX domain (restart nvidia-imex on the "
                "domain's nodes)"),
    6: Recovery("bus_reset", "bus reset", "reset-gpu", True,
                "the GPU's PCIe bus must be reset", _RESET_IT),
    7: Recovery("system_reboot", "system reboot", "drain-node", True,
                "the system must be rebooted", "drain the node and reboot it"),
}
RECOVERY_BY_NAME = {r.name: r for r in RECOVERY_ACTIONS.values()}
_RECOVERY_CHANGE = re.compile(r"recovery action changed from .*?\bto\s+0x(?P<code>[0-9a-fA-F]+)"
                              r"(?:\s*\((?P<words>[^)]*)\))?", re.IGNORECASE)
_NVLINK_FATALITY = re.compile(r"(?:^|\s)(?P<unit>[A-Z][A-Z0-9_/]*)\s+"
                              r"(?P<word>(?i:fatal|nonfatal|non-fatal))\b")


def xid_info(xid: int) -> XidInfo:
    """The table's entry, or an "unknown XID N" WARN, action rerun (docs/xid.md)."""
    known = XID_TABLE.get(xid)
    if known is not None:
        return known
    return XidInfo(xid, f"unknown XID {xid}", "warn", "rerun",
                   f"gpucheck does not know this XID: look it up in NVIDIA's Xid catalog "
                   f"({CATALOG_URL}); an XID 154 next to it names the recovery, if any")


def recovery_action(code: int) -> tuple[str, str] | None:
    """(what the driver asks, our action); None for 0 or a value newer than the table."""
    known = RECOVERY_ACTIONS.get(code)
    return None if known is None else (known.what, known.action)


def _judge_154(base: XidInfo, detail: str) -> XidInfo:
    """XID 154: follow the recovery action its line names."""
    match = _RECOVERY_CHANGE.search(detail)
    if match is None:
        return base
    code = int(match["code"], 16)
    words = (match["words"] or "").strip()
    if code == 0:
        return replace(base, meaning="GPU recovery action changed to None", severity="info",
                       action="none", advice="the GPU needs no recovery (any earlier one "
                       "was done)")
    known = recovery_action(code)
    if known is None:
        return replace(base, meaning=f"GPU recovery action changed to 0x{code:x} "
                       f"({words or 'a value gpucheck does not know'})",
                       advice=f"look the value up in nvml.h (nvmlGpuRecoveryAction_t); "
                       f"{base.advice}")
    what, action = known
    return replace(base, meaning=f"GPU recovery action changed to {words or what}",
                   severity="fail", action=action,
                   advice=f"the driver asks for a {what} before the GPU is used again")


def _judge_nvlink5(base: XidInfo, detail: str) -> XidInfo:
    """XIDs 144-150: the line's Fatal (reset-gpu) or Nonfatal (restart-app) word."""
    match = _NVLINK_FATALITY.search(detail)
    if match is None:
        return base
    unit = match["unit"]
    if match["word"].lower() == "fatal":
        return replace(base, meaning=f"{base.meaning}, fatal ({unit})", severity="fail",
                       action="reset-gpu", advice="stop the jobs on this GPU and its "
                       "NVLink peers, then reset it (nvidia-smi -r -i <index>)")
    return replace(base, meaning=f"{base.meaning}, non-fatal ({unit})", severity="warn",
                   action="restart-app", advice="the link stays up: restart an application "
                   "it stopped (an XID 45 'caused by previous Xid'); an XID 154 next to it "
                   "names any recovery; repeated ones: nvidia-smi nvlink -e")


def judge_xid(xid: int, detail: str = "", companions: Collection[int] = ()) -> XidInfo:
    """The verdict on one Xid line: the table's entry, refined by the line (154,
    144-150) or by the GPU's other XIDs (48 with a 63/64: DRAIN_AND_RESET)."""
    base = xid_info(xid)
    if xid == 154:
        return _judge_154(base, detail)
    if xid in _NVLINK5:
        return _judge_nvlink5(base, detail)
    if xid == 48 and {63, 64} & set(companions):
        return replace(base, action="drain-node", advice="drain the node, then reset the "
                       "GPU so the page is retired or the row remapped (the catalog: DBE "
                       "with 63/64 is DRAIN_AND_RESET); replace the GPU if it happens again")
    return base
