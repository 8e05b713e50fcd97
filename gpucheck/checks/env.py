"""Checks of the env area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("consistency.cuda_visible_devices", "Consistency CUDA visible devices",
          "NVML, CUDA and CUDA_VISIBLE_DEVICES against each other, and the GPUs' settings "
          "against each other (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "NVML, CUDA and CUDA_VISIBLE_DEVICES disagree, or the GPUs of one node differ in "
          "settings: configuration",
          "docs/env.md#consistency-cuda-visible-devices"),
    Check("consistency.gpu_count", "Consistency GPU count",
          "NVML, CUDA and CUDA_VISIBLE_DEVICES against each other, and the GPUs' settings "
          "against each other (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "NVML, CUDA and CUDA_VISIBLE_DEVICES disagree, or the GPUs of one node differ in "
          "settings: configuration",
          "docs/env.md#consistency-gpu-count"),
    Check("consistency.{field}", "Consistency <setting>",
          "NVML, CUDA and CUDA_VISIBLE_DEVICES against each other, and the GPUs' settings "
          "against each other (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "NVML, CUDA and CUDA_VISIBLE_DEVICES disagree, or the GPUs of one node differ in "
          "settings: configuration",
          "docs/env.md#consistency-field"),
    Check("driver.cuda_compat", "Driver CUDA compat",
          "the driver's CUDA version against torch's (gpucheck env; nvidia-smi by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the driver is older than torch's CUDA: upgrade the driver or install a matching torch",
          "docs/env.md#driver-cuda-compat"),
    Check("driver.nvml", "Driver NVML",
          "whether NVML loads and answers for every GPU (gpucheck env or gpucheck health; "
          "nvidia-smi by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the driver or nvidia-ml-py is missing, not loaded, mismatched (reboot after an "
          "upgrade) or not permitted: installation, not hardware",
          "docs/env.md#driver-nvml",
          causes=(
              Cause("gpu_lost", A.DRAIN_NODE,
                    "NVML itself says a GPU fell off the bus", F),
              Cause("needs_reset", A.RESET_GPU,
                    "NVML says a GPU needs a reset", F),
              Cause("timed_out", A.RESET_GPU,
                    "the driver timed out: a wedged GPU, which a reset clears", F),
              Cause("no_answer", A.RESET_GPU,
                    "the driver did not answer: a wedged GPU, which a reset clears", F),)),
    Check("driver.nvml_hang", "Driver NVML hang",
          "whether every NVML call comes back (gpucheck env or gpucheck health; nvidia-smi by "
          "hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "an NVML call never came back: the driver is wedged, jobs would hang too, and the "
          "usual cure is a reboot",
          "docs/env.md#driver-nvml-hang"),
    Check("driver.nvml_slow", "Driver NVML slow",
          "how long NVML calls take to answer (gpucheck env or gpucheck health; nvidia-smi by "
          "hand)",
          {W: A.NONE, F: A.NONE},
          "an NVML call answered late but answered: nothing is missing, and a late answer is "
          "mostly the driver busy elsewhere on the node; only a call that misses a second, "
          "longer budget is a hang",
          "docs/env.md#driver-nvml-slow"),
    Check("env.collect_env", "Env collect_env",
          "torch's own environment report, kept verbatim (gpucheck env; python -m "
          "torch.utils.collect_env by hand)",
          {},
          "SKIP only: shown when it could not run, never a verdict",
          "docs/env.md#env-collect-env"),
    Check("env.nodes.differ", "Env nodes differ",
          "drivers, packages and environment across the nodes of one job (gpucheck env on every "
          "node of a job)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "nodes of one job differ in drivers, packages or environment",
          "docs/env.md#env-nodes-differ"),
    Check("python.deprecated.{package}", "Python deprecated <package>",
          "deprecated packages installed beside torch (gpucheck env; pip list by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "a deprecated package to uninstall",
          "docs/env.md#python-deprecated-package"),
    Check("python.torch_location", "Python torch location",
          "the Python environment: where torch comes from, torchvision's ops (gpucheck env; pip "
          "list by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the Python environment (torch's origin, torchvision)",
          "docs/env.md#python-torch-location"),
    Check("python.torchvision_ops", "Python torchvision ops",
          "the Python environment: where torch comes from, torchvision's ops (gpucheck env; pip "
          "list by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the Python environment (torch's origin, torchvision)",
          "docs/env.md#python-torchvision-ops"),
    Check("system.memory", "System memory",
          "host memory (gpucheck env; df -h /dev/shm by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/env.md#system-memory"),
    Check("system.shm", "System /dev/shm",
          "the size of /dev/shm (gpucheck env; df -h /dev/shm by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "/dev/shm is a container or mount setting",
          "docs/env.md#system-shm"),
    Check("torch.build", "Torch build",
          "the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by"
          " hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-build"),
    Check("torch.cuda_available", "Torch CUDA available",
          "the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by"
          " hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-cuda-available"),
    Check("torch.cudnn", "Torch cuDNN",
          "the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by"
          " hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-cudnn"),
    Check("torch.import", "Torch import",
          "the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by"
          " hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-import"),
    Check("torch.nccl", "Torch NCCL",
          "the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by"
          " hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-nccl"),
    Check("torch.nccl_loaded", "Torch NCCL loaded",
          "the NCCL this process loaded beside the one torch was built against (gpucheck env; "
          "the NCCL_DEBUG=INFO version line by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software",
          "docs/env.md#torch-nccl-loaded"),
)
