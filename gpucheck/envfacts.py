"""The facts of one node's env report that should match across nodes: `env` under
torchrun compares them live, compare and fleet from saved reports (floor 1)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# gpucheck's own variables (GPUCHECK_PROGRESS, GPUCHECK_RUN_DIR, ...), never reported as
# the machine's environment (gpucheck.probes.system reads it from here).
OWN_PREFIX = "GPUCHECK_"

# (label, section, key) of the env report's data compared between nodes.
FACTS = (
    ("NVIDIA driver version", "driver", "driver_version"),
    ("CUDA driver version", "driver", "cuda_driver_version"),
    ("torch version", "torch", "version"),
    ("torch CUDA build version", "torch", "cuda_build_version"),
    ("cuDNN version", "torch", "cudnn_version"),
    ("NCCL version (torch build)", "torch", "nccl_version"),
    # The library the ranks really use (ncclGetVersion of the mapped libnccl): a site
    # NCCL or another wheel on one node changes this, not the build's figure.
    ("NCCL version loaded", "torch", "nccl_loaded_version"),
    ("GPU count (torch)", "torch", "cuda_device_count"),
    ("GPU count (driver)", "driver", "gpu_count"),
    ("Python version", "python", "python_version"),
    ("OS", "system", "os"),
    ("kernel", "system", "kernel"),
)
# Variables that differ per rank or node by nature: never a finding.
PER_NODE_VAR = re.compile(
    r"RANK|NODEID|NODENAME|PROCID|LOCALID|TASK_PID|HOSTNAME|TOPOLOGY_ADDR|GTIDS|"
    r"LAUNCH_NODE_IPADDR|^TORCHELASTIC_|^MASTER_PORT$|^LOCAL_WORLD_SIZE$|^PMIX?_|"
    r"^GPUCHECK_RUN_DIR$|^SLURM_CPU_BIND|^SLURM_STEP_|^SLURM_TASKS_PER_NODE$")


def node_facts(report: Mapping[str, Any]) -> dict[str, str]:
    """The facts of one node's env report (as a dict) that should match across nodes."""
    data = {s["name"]: s.get("data") or {} for s in report.get("sections", [])}
    facts = {label: str(data.get(section, {}).get(key)) for label, section, key in FACTS}
    models = sorted({str(g.get("name")) for g in data.get("gpus", {}).get("gpus") or []
                     if isinstance(g, dict)})
    facts["GPU model"] = ", ".join(models) or "none"
    variables = data.get("environment", {}).get("variables") or {}
    for name, value in variables.items():
        # OWN_PREFIX: reports written before gpucheck stopped listing its own variables
        # still hold them (GPUCHECK_PROGRESS differs between a terminal and cron).
        if not PER_NODE_VAR.search(name) and not str(name).startswith(OWN_PREFIX):
            facts[f"${name}"] = str(value)
    return facts
