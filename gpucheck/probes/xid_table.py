"""What each NVIDIA XID means, how bad it is, and what to do about it.

XIDs are the driver's error codes, logged to the kernel log as
`NVRM: Xid (PCI:0000:3b:00): 79, ...` (see them with `sudo dmesg | grep -i xid`).
NVIDIA's catalog is https://docs.nvidia.com/deploy/xid-errors/ ; this table keeps
only the XIDs whose meaning we are sure of. Any other XID is reported as
"unknown XID N" (a WARN pointing at the catalog), never silently dropped.

Severity is about the GPU, not the job: an application-level XID (13, 31, 43,
45, ...) means a program faulted on a healthy GPU, so it is information, not a
GPU fault. The action is one of `ACTIONS`, the same words every gpucheck finding
will use once findings carry an action.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS = ("none", "rerun", "fix-config", "restart-app", "reset-gpu", "drain-node",
           "replace-hardware")
SEVERITIES = ("info", "warn", "fail")
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@dataclass(frozen=True)
class XidInfo:
    """One XID: its meaning, its severity for the GPU, the action, and the advice."""

    xid: int
    meaning: str
    severity: str  # one of SEVERITIES
    action: str  # one of ACTIONS
    advice: str  # what a person should do, in one sentence


_APP = "the application's own fault on a healthy GPU: fix or restart the program"

XID_TABLE: dict[int, XidInfo] = {info.xid: info for info in (
    XidInfo(8, "GPU stopped processing (channel idle timeout)", "warn", "restart-app",
            "restart the application; if it recurs with no application at fault, reset the "
            "GPU"),
    XidInfo(13, "Graphics Engine Exception", "info", "restart-app",
            f"{_APP} (often an out-of-range access or an illegal instruction in a kernel)"),
    XidInfo(31, "GPU memory page fault", "info", "restart-app",
            f"{_APP} (an illegal memory address, as compute-sanitizer would show)"),
    XidInfo(32, "Invalid or corrupted push buffer stream", "warn", "restart-app",
            "restart the application; repeated ones point at host memory or the PCIe bus"),
    XidInfo(43, "GPU stopped processing", "info", "restart-app",
            f"{_APP} (the driver stopped a channel that faulted)"),
    XidInfo(45, "Preemptive cleanup, due to previous errors", "info", "none",
            "the driver cleaned up after an earlier error or a killed program: look at the "
            "XIDs before it"),
    XidInfo(46, "GPU stopped processing", "fail", "drain-node",
            "drain the node and reset the GPU (nvidia-smi -r -i <index>); replace it if it "
            "happens again"),
    XidInfo(48, "Double bit ECC error (uncorrectable memory error)", "fail", "drain-node",
            "drain the node, reset the GPU so the page is retired or the row remapped; "
            "replace the GPU if it happens again"),
    XidInfo(61, "Internal micro-controller breakpoint/warning", "warn", "reset-gpu",
            "reset the GPU when it is idle; report it to NVIDIA if it recurs"),
    XidInfo(62, "Internal micro-controller halt", "fail", "reset-gpu",
            "reset the GPU (nvidia-smi -r -i <index>) before using it again"),
    XidInfo(63, "ECC page retirement or row remapping recording event", "warn", "reset-gpu",
            "a bad memory row was recorded: reset the GPU when it is idle so the retirement "
            "or remap takes effect"),
    XidInfo(64, "ECC page retirement or row remapper recording failure", "fail",
            "replace-hardware",
            "the GPU could not retire a bad memory page or remap a row: drain the node and "
            "replace the GPU"),
    XidInfo(68, "NVDEC0 exception (video decoder)", "warn", "restart-app",
            "restart the application using the video decoder; reset the GPU if it recurs"),
    XidInfo(69, "Graphics Engine class error", "info", "restart-app", _APP),
    XidInfo(74, "NVLink error", "fail", "reset-gpu",
            "reset the GPU (with its NVLink peers) and check the links with "
            "nvidia-smi nvlink -s; drain the node and replace hardware if it recurs"),
    XidInfo(79, "GPU has fallen off the bus", "fail", "drain-node",
            "the GPU is gone from the PCIe bus: drain the node and reboot it; check power, "
            "cooling and seating, and replace the GPU if it happens again"),
    XidInfo(92, "High single-bit ECC error rate", "warn", "none",
            "the errors were corrected; watch nvidia-smi -q -d ECC and replace the GPU if "
            "the rate keeps growing"),
    XidInfo(94, "Contained ECC error", "warn", "restart-app",
            "only the applications using the bad memory were stopped: restart them; reset "
            "the GPU when it is idle to remap the row"),
    XidInfo(95, "Uncontained ECC error", "fail", "reset-gpu",
            "every application on this GPU is affected: drain the node and reset the GPU "
            "before using it again"),
    XidInfo(109, "Context switch timeout", "warn", "restart-app",
            "restart the application; reset the GPU if it recurs with other programs"),
    XidInfo(119, "GSP RPC timeout", "fail", "reset-gpu",
            "the GPU System Processor stopped answering: reset the GPU (or reboot the node) "
            "before using it again"),
    XidInfo(120, "GSP error", "fail", "reset-gpu",
            "the GPU System Processor failed: reset the GPU (or reboot the node) before "
            "using it again"),
    XidInfo(140, "ECC unrecovered error", "fail", "drain-node",
            "drain the node and reset the GPU; replace it if it happens again"),
)}


def xid_info(xid: int) -> XidInfo:
    """The table's entry, or an "unknown XID N" WARN pointing at NVIDIA's catalog."""
    known = XID_TABLE.get(xid)
    if known is not None:
        return known
    return XidInfo(xid, f"unknown XID {xid}", "warn", "none",
                   f"gpucheck does not know this XID: look it up in NVIDIA's catalog "
                   f"({CATALOG_URL})")
