"""The checks of one node's state, one row each: env, gpu, faults and the kernel log,
health. A row's title and docs anchor come from its id unless given (check.py)."""

from __future__ import annotations

from dataclasses import replace

from gpucheck.checks.check import INFO, SITE, Action, Cause, Check, Status, both, how, table_causes

A, W, F = Action, Status.WARN, Status.FAIL
_IB = how("gpucheck health; ibstat by hand")
_NVML = how("gpucheck env or gpucheck health; nvidia-smi by hand")
_WATCH = how("the fault watcher beside bench, comm and stress; nvidia-smi -q -d "
              "ECC,PAGE_RETIREMENT by hand")
_PIP = how("gpucheck env; pip list by hand")
_ENV = how("gpucheck env; nvidia-smi -q by hand")
_NVLINK5 = _WATCH("NVLink5 recovery and error counters during the run")
_NVLINK = _WATCH("NVLink state and CRC/replay counters during the run")
_AGAINST = _ENV("NVML, CUDA and CUDA_VISIBLE_DEVICES against each other, and the GPUs' settings "
                 "against each other")
_EVENTS = _WATCH("NVML events during the run")
_BUILD = ("the torch build: import, CUDA, cuDNN, NCCL (gpucheck env; python -c 'import torch' by "
          "hand)")
_FABRIC = _ENV("NVSwitch fabric state, health and registration")
_DISAGREE = ("NVML, CUDA and CUDA_VISIBLE_DEVICES disagree, or the GPUs of one node differ in "
             "settings: configuration")
_FALLBACK_FAIL = ("no rule today: gpucheck's fallback for an unknown id (an unexplained failure "
                  "must not keep taking jobs)")
_PYTHON = "the Python environment (torch's origin, torchvision)"
_TABLE = ("the action comes from the per-XID or per-event table (probes/xid_table.py, "
          "faults/judge.py), given as a cause 'table.<action>'; these defaults are for a "
          "finding without one")
_TORCH = ("the torch installation (CPU-only, no cuDNN or NCCL, CUDA unavailable for a driver or "
          "fabric reason): software")

CHECKS: tuple[Check, ...] = (
    # env
    Check("consistency.cuda_visible_devices", _AGAINST, both(A.FIX_CONFIG), _DISAGREE),
    Check("consistency.gpu_count", _AGAINST, both(A.FIX_CONFIG), _DISAGREE),
    Check("consistency.{field}", _AGAINST, both(A.FIX_CONFIG), _DISAGREE),
    Check("driver.cuda_compat", "the driver's CUDA version against torch's (gpucheck env; "
          "nvidia-smi by hand)",
          both(A.FIX_CONFIG), "the driver is older than torch's CUDA: upgrade the driver or "
          "install a matching torch"),
    Check("driver.nvml", _NVML("whether NVML loads and answers for every GPU"), both(A.FIX_CONFIG),
          "the driver or nvidia-ml-py is missing, not loaded, mismatched (reboot after an "
          "upgrade) or not permitted: installation, not hardware",
          causes=(Cause("gpu_lost", A.DRAIN_NODE, "NVML itself says a GPU fell off the bus", F),
                  Cause("needs_reset", A.RESET_GPU, "NVML says a GPU needs a reset", F),
                  Cause("timed_out", A.RESET_GPU, "the driver timed out: a wedged GPU, which a "
                        "reset clears", F),
                  Cause("no_answer", A.RESET_GPU, "the driver did not answer: a wedged GPU, which "
                        "a reset clears", F))),
    Check("driver.nvml_hang", _NVML("whether every NVML call comes back"), both(A.DRAIN_NODE),
          "an NVML call never came back: the driver is wedged, jobs would hang too, and the usual "
          "cure is a reboot"),
    Check("driver.nvml_slow", _NVML("how long NVML calls take to answer"), both(A.NONE),
          "an NVML call answered late but answered: nothing is missing, and a late answer is "
          "mostly the driver busy elsewhere on the node; only a call that misses a second, longer "
          "budget is a hang"),
    Check("env.collect_env", "torch's own environment report, kept verbatim (gpucheck env; python "
          "-m torch.utils.collect_env by hand)",
          {}, "SKIP only: shown when it could not run, never a verdict", title="Env collect_env"),
    Check("env.nodes.differ", "drivers, packages and environment across the nodes of one job "
          "(gpucheck env on every node of a job)",
          both(A.FIX_CONFIG), "nodes of one job differ in drivers, packages or environment"),
    Check("python.deprecated.{package}", _PIP("deprecated packages installed beside torch"),
          both(A.FIX_CONFIG), "a deprecated package to uninstall"),
    Check("python.torch_location",
          _PIP("the Python environment: where torch comes from, torchvision's ops"),
          both(A.FIX_CONFIG), _PYTHON),
    Check("python.torchvision_ops",
          _PIP("the Python environment: where torch comes from, torchvision's ops"),
          both(A.FIX_CONFIG), _PYTHON),
    Check("system.memory", "host memory (gpucheck env; df -h /dev/shm by hand)", {}, INFO),
    Check("system.shm", "the size of /dev/shm (gpucheck env; df -h /dev/shm by hand)",
          both(A.FIX_CONFIG), "/dev/shm is a container or mount setting"),
    Check("torch.build", _BUILD, both(A.FIX_CONFIG), _TORCH),
    Check("torch.cuda_available", _BUILD, both(A.FIX_CONFIG), _TORCH),
    Check("torch.cudnn", _BUILD, both(A.FIX_CONFIG), _TORCH),
    Check("torch.import", _BUILD, both(A.FIX_CONFIG), _TORCH),
    Check("torch.nccl", _BUILD, both(A.FIX_CONFIG), _TORCH),
    Check("torch.nccl_loaded", "the NCCL this process loaded beside the one torch was built "
          "against (gpucheck env; the NCCL_DEBUG=INFO version line by hand)",
          both(A.FIX_CONFIG), _TORCH),
    # gpu
    Check("gpu.arch_supported", _ENV("whether torch ships kernels for each GPU's architecture"),
          both(A.FIX_CONFIG), "this torch build lacks kernels for the GPU: install another torch "
          "or upgrade the driver"),
    Check("gpu.bank_remap.pending", _ENV("memory bank remapping pending"), both(A.RESET_GPU),
          "the bank remap takes effect at the next reset, as a pending row remap"),
    Check("gpu.busy", _ENV("the processes using each GPU"), both(A.RERUN),
          "another process shares the GPU: measure again when it is idle; the GPU is not at fault"),
    Check("gpu.clocks.event_reasons", _ENV("clock event reasons (thermal, power brake, slowdown)"),
          both(A.DRAIN_NODE), "thermal or power-brake slowdown: cooling or power needs a look and "
          "slows every job; as the fault watcher's faults.clocks.slowdown"),
    Check("gpu.count", "the number of GPUs against the node's expected count and the PCI bus "
          "(gpucheck health --expect-gpus N; nvidia-smi -L and lspci by hand)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE}, "WARN: more GPUs than expected, or fewer than the "
          "PCI bus shows with no count given: state the node's count (--expect-gpus) to judge it; "
          "FAIL: fewer GPUs than the node should have: one fell off the bus or failed to "
          "initialise; jobs sized for the node cannot run"),
    Check("gpu.ecc.aggregate_uncorrected", _ENV("ECC error counters (volatile and aggregate)"),
          both(A.NONE), "lifetime count, history not news: watch it; the volatile counter and row "
          "remapping judge the present"),
    Check("gpu.ecc.volatile_uncorrected", _ENV("ECC error counters (volatile and aggregate)"),
          both(A.DRAIN_NODE), "a double-bit (uncorrectable) ECC error corrupts data: take the "
          "node out until the GPU is reset and checked"),
    Check("gpu.fabric", _FABRIC, both(A.FIX_CONFIG), "the NVSwitch fabric manager is not running "
          "or does not match the driver",
          causes=(Cause("registering", A.RERUN, "registration is still going on (a minute after "
                        "boot)"),)),
    Check("gpu.fabric.configuration", _FABRIC, both(A.FIX_CONFIG), "the fabric names a "
          "configuration error (system GUID, chassis serial, partition, firmware, location)",
          causes=(Cause("insufficient_nvlinks", A.DRAIN_NODE, "too few NVLinks came up to join "
                        "the fabric: a hardware fault"),)),
    Check("gpu.fabric.degraded_bandwidth", _FABRIC, both(A.DRAIN_NODE),
          "NVLink bandwidth through the fabric is degraded: every collective is slower until the "
          "link or switch is fixed"),
    Check("gpu.fabric.health", _FABRIC, both(A.DRAIN_NODE), "NVML's own summary says the NVSwitch "
          "fabric is unhealthy or at limited capacity: out of service until the fabric is checked"),
    Check("gpu.fabric.recovering", _FABRIC, both(A.RERUN), "the fabric is recovering a route or "
          "an access timeout by itself: look again when it has finished"),
    Check("gpu.fabric.route_unhealthy", _FABRIC, both(A.DRAIN_NODE), "a fabric route is "
          "unhealthy: NVLink traffic to some peers can fail"),
    Check("gpu.functional", "a small GEMM on each GPU against the CPU's result (gpucheck env (a "
          "small GEMM on each GPU))",
          both(A.DRAIN_NODE), "the GPU computed a wrong product, raised or hung on a small test: "
          "it must not take jobs until reset and diagnosed"),
    Check("gpu.lost", _ENV("whether a GPU fell off the bus"), both(A.DRAIN_NODE),
          "fell off the bus (Xid 79): a reset in place rarely works, the node needs a reboot or "
          "power-cycle and the cause (power, PCIe, the GPU) a look; as the kernel-log and "
          "fault-watcher findings decide"),
    Check("gpu.memory_retirement", _ENV("page retirement and row remapping"), {}, INFO),
    Check("gpu.mig_mode", _ENV("MIG mode, current and pending"), both(A.RESET_GPU),
          "a pending MIG change takes effect at the next reset",
          title="GPU MIG mode"),
    Check("gpu.numa", _ENV("each GPU's NUMA node"), {}, INFO),
    Check("gpu.pcie.width", _ENV("each GPU's PCIe link width and generation against its maximum"),
          both(A.REPLACE_HARDWARE), "a narrower link than the slot's is a seating, riser or slot "
          "fault: hands on the box (reseat, then replace); as the fault watcher's PCIe-replay "
          "WARN"),
    Check("gpu.persistence_mode", _ENV("persistence mode"), both(A.FIX_CONFIG),
          "a driver setting (nvidia-smi -pm 1, nvidia-persistenced)"),
    Check("gpu.query", _ENV("whether each GPU answers NVML queries"), both(A.RESET_GPU),
          "the GPU stopped answering queries (reset required, timeouts): a reset is the first cure",
          causes=(Cause("no_permission", A.FIX_CONFIG, "a permission problem, not the GPU"),)),
    Check("gpu.recovery_action", _ENV("the recovery action NVML asks for"), both(A.DRAIN_NODE),
          "NVML asks for a node reboot, a drain (of P2P traffic, or before a reset), an "
          "IMEX-domain recovery, or an action gpucheck does not know: the node must stop taking "
          "work",
          causes=(Cause("gpu_reset", A.RESET_GPU, "NVML asks for a GPU reset: nvidia-smi -r "
                        "clears it, the node may stay"),
                  Cause("bus_reset", A.RESET_GPU, "NVML asks for a reset of the GPU's PCIe bus"))),
    Check("gpu.remapped_rows.failed", _ENV("memory row remapping (pending, failed)"),
          both(A.REPLACE_HARDWARE), "the GPU has no spare rows left to remap: it needs an RMA"),
    Check("gpu.remapped_rows.pending", _ENV("memory row remapping (pending, failed)"),
          both(A.RESET_GPU), "the row remap takes effect at the next reset; until then the bad "
          "row stays in use"),
    Check("gpu.retired_pages.pending", _ENV("pages pending retirement"), both(A.RESET_GPU),
          "the retirement takes effect at the next reset"),
    Check("gpu.topology", _ENV("the GPU-to-GPU topology matrix"), both(A.RERUN),
          "a topology query failed after every GPU answered: transient until it repeats",
          causes=(Cause("no_answer", A.RESET_GPU, "a GPU stopped answering, as for gpu.query"),
                  Cause("timed_out", A.RESET_GPU,
                        "a GPU's driver call timed out, as for gpu.query"))),
    # faults
    Check("faults.bank_remap.pending", _WATCH("bank remapping during the run"), {F: A.RESET_GPU},
          SITE),
    Check("faults.bank_remaps", _WATCH("bank remapping during the run"), {W: A.RERUN}, SITE),
    Check("faults.clocks.slowdown", _WATCH("clock slowdowns during the run"), {W: A.DRAIN_NODE},
          SITE),
    Check("faults.ecc.corrected", _WATCH("ECC counters during the run"), {W: A.RERUN}, SITE),
    Check("faults.ecc.uncorrected", _WATCH("ECC counters during the run"), {F: A.DRAIN_NODE},
          SITE),
    Check("faults.event.gpu_recovery_action", _EVENTS, {F: A.DRAIN_NODE}, _FALLBACK_FAIL),
    Check("faults.event.unknown", _EVENTS, {W: A.RERUN}, SITE),
    Check("faults.event.{kind}", _EVENTS, {W: A.RERUN, F: A.DRAIN_NODE}, _TABLE),
    Check("faults.gpu_lost", _WATCH("whether a GPU was lost during the run"), {F: A.DRAIN_NODE},
          _FALLBACK_FAIL),
    Check("faults.nvlink.crc", _NVLINK, {W: A.REPLACE_HARDWARE}, SITE),
    Check("faults.nvlink.down", _NVLINK, {F: A.RESET_GPU}, SITE),
    Check("faults.nvlink.recovery", _NVLINK, {F: A.RESET_GPU}, SITE),
    Check("faults.nvlink5", _NVLINK5, {}, INFO),
    Check("faults.nvlink5.errors", _NVLINK5, {W: A.REPLACE_HARDWARE}, SITE),
    Check("faults.nvlink5.recovery", _NVLINK5, {F: A.RESET_GPU}, SITE),
    Check("faults.nvml_slow", _WATCH("how long NVML answered during the run"), {W: A.NONE}, SITE),
    Check("faults.pcie.replay", _WATCH("PCIe replays during the run"), {W: A.REPLACE_HARDWARE},
          SITE),
    Check("faults.remapped_rows.failed", _WATCH("row remapping during the run"),
          {F: A.REPLACE_HARDWARE}, SITE),
    Check("faults.remapped_rows.pending", _WATCH("row remapping during the run"), {F: A.RESET_GPU},
          SITE),
    Check("faults.retired_pages", _WATCH("page retirement during the run"), both(A.RESET_GPU),
          SITE),
    Check("faults.summary", _WATCH("every fault counter of the run"), {}, INFO),
    Check("faults.watch", _WATCH("the fault watcher itself"), {W: A.RERUN}, SITE),
    Check("faults.xid", _WATCH("Xid and memory events during the run"), {W: A.RERUN}, _TABLE),
    Check("kernel_log.read", "Xid lines in the kernel log (gpucheck env or health; dmesg | grep "
          "-i xid by hand)",
          {}, INFO),
    Check("kernel_log.xid", "Xid lines in the kernel log (gpucheck env or health; dmesg | grep -i "
          "xid by hand)",
          {W: A.RERUN, F: A.DRAIN_NODE}, _TABLE),
    # health
    Check("health.state", "whether the state dir can be read and written (gpucheck health)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE}, "WARN: the state could not be written: disk space "
          "or rights; the checks themselves ran; FAIL: a state that could not be read may have "
          "held a fault that never clears by itself: the node is not known to be healthy until an "
          "administrator clears it"),
    Check("ib.port.link_downed", _IB("each port's link-downed counter since the last check"),
          both(A.DRAIN_NODE), "the link went down and retrained since the last check: a flapping "
          "link breaks NCCL jobs at random until it is looked at"),
    Check("ib.port.rate", _IB("each port's rate against its peers"), both(A.REPLACE_HARDWARE),
          "a port trained to a lower rate than its peers: a cable, transceiver or switch port to "
          "reseat or replace; as gpu.pcie.width"),
    Check("ib.port.state", _IB("each port's state"), {W: A.FIX_CONFIG, F: A.DRAIN_NODE},
          "WARN: a port never seen active is down or not configured: an unused port to disable or "
          "ignore, or a subnet manager to start; FAIL: a port this node has seen active is down: "
          "NCCL over that rail fails or falls back until the link is fixed"),
    Check("ib.ports", _IB("the number of active InfiniBand/RoCE ports"), both(A.DRAIN_NODE),
          "fewer active InfiniBand/RoCE ports than the node should have: multi-node jobs lose a "
          "rail or cannot start"),
)
# Every id the fault watcher and the kernel-log reader make may carry the action its
# table row names, as the cause "table.<action>" (the site's data, not its words).
CHECKS = tuple(replace(c, causes=c.causes + table_causes())
               if c.id.startswith(("faults.", "kernel_log.xid")) else c for c in CHECKS)
