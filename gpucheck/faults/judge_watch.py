"""How the watcher's own trouble is judged: a GPU lost, or other watcher errors.

A GPU is lost when NVML says so (NVMLError_GpuIsLost, NVMLError_ResetRequired) or
when a call never came back (our "Timeout", which the doorway declares only after
a second, longer budget: gpucheck/probes/nvml.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.faults.counters import LOST_KINDS
from gpucheck.faults.verdict import Verdict
from gpucheck.report import Status


def judge_errors(result: Mapping[str, Any]) -> list[Verdict]:
    """The GPU stopped answering (lost, needs a reset, driver hang): FAIL; other
    watcher trouble: WARN, and what was read before it is still judged."""
    errors = result.get("errors") or []
    lost = [e for e in errors if e.get("kind") in LOST_KINDS]
    if lost:
        first = lost[0]
        return [Verdict("faults.gpu_lost", Status.FAIL, f"the GPU stopped answering NVML "
                        f"{first['phase']}: {first['message']}", "drain-node",
                        "check dmesg for Xid 79 ('fallen off the bus'); reset the GPU "
                        "(nvidia-smi -r -i <index>) or reboot the node; replace it if it "
                        "happens again")]
    return [Verdict("faults.watch", Status.WARN, f"the fault watcher ran into trouble "
                    f"{e['phase']} ({e['message']}); what it could not read is n/a",
                    "rerun", "run again; report a gpucheck bug if it repeats", key=str(i))
            for i, e in enumerate(errors)]
