"""Checks of the gpu area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("gpu.arch_supported", "GPU arch supported",
          "whether torch ships kernels for each GPU's architecture (gpucheck env; nvidia-smi -q "
          "by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "this torch build lacks kernels for the GPU: install another torch or upgrade the "
          "driver",
          "docs/env.md#gpu-arch-supported"),
    Check("gpu.bank_remap.pending", "GPU bank remap pending",
          "memory bank remapping pending (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "the bank remap takes effect at the next reset, as a pending row remap",
          "docs/env.md#gpu-bank-remap-pending"),
    Check("gpu.busy", "GPU busy",
          "the processes using each GPU (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RERUN, F: A.RERUN},
          "another process shares the GPU: measure again when it is idle; the GPU is not at "
          "fault",
          "docs/env.md#gpu-busy"),
    Check("gpu.clocks.event_reasons", "GPU clocks event reasons",
          "clock event reasons (thermal, power brake, slowdown) (gpucheck env; nvidia-smi -q by "
          "hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "thermal or power-brake slowdown: cooling or power needs a look and slows every job; "
          "as the fault watcher's faults.clocks.slowdown",
          "docs/env.md#gpu-clocks-event-reasons"),
    Check("gpu.count", "GPU count",
          "the number of GPUs against the node's expected count and the PCI bus (gpucheck health"
          " --expect-gpus N; nvidia-smi -L and lspci by hand)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE},
          "WARN: more GPUs than expected, or fewer than the PCI bus shows with no count given: "
          "state the node's count (--expect-gpus) to judge it; FAIL: fewer GPUs than the node "
          "should have: one fell off the bus or failed to initialise; jobs sized for the node "
          "cannot run",
          "docs/env.md#gpu-count"),
    Check("gpu.ecc.aggregate_uncorrected", "GPU ECC aggregate uncorrected",
          "ECC error counters (volatile and aggregate) (gpucheck env; nvidia-smi -q by hand)",
          {W: A.NONE, F: A.NONE},
          "lifetime count, history not news: watch it; the volatile counter and row remapping "
          "judge the present",
          "docs/env.md#gpu-ecc-aggregate-uncorrected"),
    Check("gpu.ecc.volatile_uncorrected", "GPU ECC volatile uncorrected",
          "ECC error counters (volatile and aggregate) (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "a double-bit (uncorrectable) ECC error corrupts data: take the node out until the GPU"
          " is reset and checked",
          "docs/env.md#gpu-ecc-volatile-uncorrected"),
    Check("gpu.fabric", "GPU fabric",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the NVSwitch fabric manager is not running or does not match the driver",
          "docs/env.md#gpu-fabric",
          causes=(
              Cause("registering", A.RERUN,
                    "registration is still going on (a minute after boot)"),)),
    Check("gpu.fabric.configuration", "GPU fabric configuration",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the fabric names a configuration error (system GUID, chassis serial, partition, "
          "firmware, location)",
          "docs/env.md#gpu-fabric-configuration",
          causes=(
              Cause("insufficient_nvlinks", A.DRAIN_NODE,
                    "too few NVLinks came up to join the fabric: a hardware fault"),)),
    Check("gpu.fabric.degraded_bandwidth", "GPU fabric degraded bandwidth",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "NVLink bandwidth through the fabric is degraded: every collective is slower until the"
          " link or switch is fixed",
          "docs/env.md#gpu-fabric-degraded-bandwidth"),
    Check("gpu.fabric.health", "GPU fabric health",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "NVML's own summary says the NVSwitch fabric is unhealthy or at limited capacity: out "
          "of service until the fabric is checked",
          "docs/env.md#gpu-fabric-health"),
    Check("gpu.fabric.recovering", "GPU fabric recovering",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RERUN, F: A.RERUN},
          "the fabric is recovering a route or an access timeout by itself: look again when it "
          "has finished",
          "docs/env.md#gpu-fabric-recovering"),
    Check("gpu.fabric.route_unhealthy", "GPU fabric route unhealthy",
          "NVSwitch fabric state, health and registration (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "a fabric route is unhealthy: NVLink traffic to some peers can fail",
          "docs/env.md#gpu-fabric-route-unhealthy"),
    Check("gpu.functional", "GPU functional",
          "a small GEMM on each GPU against the CPU's result (gpucheck env (a small GEMM on each"
          " GPU))",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "the GPU computed a wrong product, raised or hung on a small test: it must not take "
          "jobs until reset and diagnosed",
          "docs/env.md#gpu-functional"),
    Check("gpu.lost", "GPU lost",
          "whether a GPU fell off the bus (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "fell off the bus (Xid 79): a reset in place rarely works, the node needs a reboot or "
          "power-cycle and the cause (power, PCIe, the GPU) a look; as the kernel-log and fault-"
          "watcher findings decide",
          "docs/env.md#gpu-lost"),
    Check("gpu.memory_retirement", "GPU memory retirement",
          "page retirement and row remapping (gpucheck env; nvidia-smi -q by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/env.md#gpu-memory-retirement"),
    Check("gpu.mig_mode", "GPU MIG mode",
          "MIG mode, current and pending (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "a pending MIG change takes effect at the next reset",
          "docs/env.md#gpu-mig-mode"),
    Check("gpu.numa", "GPU NUMA",
          "each GPU's NUMA node (gpucheck env; nvidia-smi -q by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/env.md#gpu-numa"),
    Check("gpu.pcie.width", "GPU PCIe width",
          "each GPU's PCIe link width and generation against its maximum (gpucheck env; nvidia-"
          "smi -q by hand)",
          {W: A.REPLACE_HARDWARE, F: A.REPLACE_HARDWARE},
          "a narrower link than the slot's is a seating, riser or slot fault: hands on the box "
          "(reseat, then replace); as the fault watcher's PCIe-replay WARN",
          "docs/env.md#gpu-pcie-width"),
    Check("gpu.persistence_mode", "GPU persistence mode",
          "persistence mode (gpucheck env; nvidia-smi -q by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "a driver setting (nvidia-smi -pm 1, nvidia-persistenced)",
          "docs/env.md#gpu-persistence-mode"),
    Check("gpu.query", "GPU query",
          "whether each GPU answers NVML queries (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "the GPU stopped answering queries (reset required, timeouts): a reset is the first "
          "cure",
          "docs/env.md#gpu-query",
          causes=(
              Cause("no_permission", A.FIX_CONFIG,
                    "a permission problem, not the GPU"),)),
    Check("gpu.recovery_action", "GPU recovery action",
          "the recovery action NVML asks for (gpucheck env; nvidia-smi -q by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "NVML asks for a node reboot, a drain (of P2P traffic, or before a reset), an IMEX-"
          "domain recovery, or an action gpucheck does not know: the node must stop taking work",
          "docs/env.md#gpu-recovery-action",
          causes=(
              Cause("gpu_reset", A.RESET_GPU,
                    "NVML asks for a GPU reset: nvidia-smi -r clears it, the node may stay"),
              Cause("bus_reset", A.RESET_GPU,
                    "NVML asks for a reset of the GPU's PCIe bus"),)),
    Check("gpu.remapped_rows.failed", "GPU remapped rows failed",
          "memory row remapping (pending, failed) (gpucheck env; nvidia-smi -q by hand)",
          {W: A.REPLACE_HARDWARE, F: A.REPLACE_HARDWARE},
          "the GPU has no spare rows left to remap: it needs an RMA",
          "docs/env.md#gpu-remapped-rows-failed"),
    Check("gpu.remapped_rows.pending", "GPU remapped rows pending",
          "memory row remapping (pending, failed) (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "the row remap takes effect at the next reset; until then the bad row stays in use",
          "docs/env.md#gpu-remapped-rows-pending"),
    Check("gpu.retired_pages.pending", "GPU retired pages pending",
          "pages pending retirement (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "the retirement takes effect at the next reset",
          "docs/env.md#gpu-retired-pages-pending"),
    Check("gpu.topology", "GPU topology",
          "the GPU-to-GPU topology matrix (gpucheck env; nvidia-smi -q by hand)",
          {W: A.RERUN, F: A.RERUN},
          "a topology query failed after every GPU answered: transient until it repeats",
          "docs/env.md#gpu-topology",
          causes=(
              Cause("no_answer", A.RESET_GPU,
                    "a GPU stopped answering, as for gpu.query"),
              Cause("timed_out", A.RESET_GPU,
                    "a GPU's driver call timed out, as for gpu.query"),)),
)
