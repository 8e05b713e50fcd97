"""How the watcher's own trouble is judged: a GPU lost, NVML slow, other errors.

Lost is what NVML says, or a call that never came back. NVML's return codes
(NVML API reference, nvmlReturn_t): NVML_ERROR_GPU_IS_LOST "The GPU has fallen off
the bus or has otherwise become inaccessible", NVML_ERROR_RESET_REQUIRED "The GPU
requires a reset before it can be used again". A call that never came back is our
"Timeout", which the doorway (gpucheck/probes/nvml.py) declares only when a call
misses its budget and then a second, longer one. A call that missed its budget but
answered within the second is slow, not lost: the budget counts the time the call
queued behind the driver's other work (rank 0 creating CUDA contexts on every GPU
in stress's P2P phase, say), so one late answer says nothing about the GPU. XID 79
("fallen off the bus") is judged with the other XIDs (judge_events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.faults.counters import LOST_KINDS
from gpucheck.faults.verdict import Verdict
from gpucheck.probes.nvml import SLOW_ADVICE, slow_words
from gpucheck.report import Status

# What each way of being lost means, and its action.
_LOST: dict[str, tuple[str, str, str]] = {
    "NVMLError_GpuIsLost": ("NVML says the GPU is lost (fell off the bus or became "
                            "inaccessible)", "drain-node", "check dmesg for Xid 79 ('fallen "
                            "off the bus'); a reset in place rarely works: reboot or "
                            "power-cycle the node, and replace the GPU if it happens again"),
    "NVMLError_ResetRequired": ("NVML says the GPU needs a reset before it can be used "
                                "again", "reset-gpu", "reset the GPU (nvidia-smi -r -i "
                                "<index>) when it is idle, or reboot the node"),
    "Timeout": ("an NVML call never came back, within its budget nor a second, longer one",
                "drain-node", "the driver is wedged on this GPU and jobs would hang too: "
                "check dmesg for Xid errors; reboot the node (a GPU reset rarely frees a "
                "wedged driver); replace the GPU if it happens again"),
}


def judge_lost(result: Mapping[str, Any]) -> Verdict | None:
    """FAIL `faults.gpu_lost` when the GPU stopped answering; None when it did not."""
    lost = [e for e in result.get("errors") or [] if e.get("kind") in LOST_KINDS]
    if not lost:
        return None
    first = lost[0]
    words, action, advice = _LOST.get(first.get("kind"), _LOST["Timeout"])
    return Verdict("faults.gpu_lost", Status.FAIL, f"{words}, {first['phase']} "
                   f"({first['message']})", action, advice)


def judge_slow(result: Mapping[str, Any]) -> Verdict | None:
    """WARN `faults.nvml_slow` (action none) when calls answered late but answered."""
    calls = [(c["function"], float(c["waited_s"]), float(c["budget_s"]))
             for c in result.get("nvml_slow") or []]
    if not calls:
        return None
    return Verdict("faults.nvml_slow", Status.WARN, f"NVML slow, not lost: {slow_words(calls)}",
                   "none", SLOW_ADVICE)


def judge_errors(result: Mapping[str, Any]) -> list[Verdict]:
    """The GPU stopped answering: FAIL (and nothing else of the watcher's is said);
    NVML slow: WARN; other watcher trouble: WARN, and what was read before it is
    still judged."""
    lost = judge_lost(result)
    if lost is not None:
        return [lost]
    slow = judge_slow(result)
    errors = result.get("errors") or []
    return [*([slow] if slow else []),
            *(Verdict("faults.watch", Status.WARN, f"the fault watcher ran into trouble "
                      f"{e['phase']} ({e['message']}); what it could not read is n/a",
                      "rerun", "run again; report a gpucheck bug if it repeats", key=str(i))
              for i, e in enumerate(errors))]
