"""Checks of the faults area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from dataclasses import replace

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Check, table_causes

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("faults.bank_remap.pending", "Faults bank remap pending",
          "bank remapping during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-bank-remap-pending"),
    Check("faults.bank_remaps", "Faults bank remaps",
          "bank remapping during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-bank-remaps"),
    Check("faults.clocks.slowdown", "Faults clocks slowdown",
          "clock slowdowns during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.DRAIN_NODE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-clocks-slowdown"),
    Check("faults.ecc.corrected", "Faults ECC corrected",
          "ECC counters during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-ecc-corrected"),
    Check("faults.ecc.uncorrected", "Faults ECC uncorrected",
          "ECC counters during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.DRAIN_NODE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-ecc-uncorrected"),
    Check("faults.event.gpu_recovery_action", "Faults event GPU recovery action",
          "NVML events during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.DRAIN_NODE},
          "no rule today: gpucheck's fallback for an unknown id (an unexplained failure must not"
          " keep taking jobs)",
          "docs/faults.md#faults-event-gpu-recovery-action"),
    Check("faults.event.unknown", "Faults event unknown",
          "NVML events during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-event-unknown"),
    Check("faults.event.{kind}", "Faults event <kind>",
          "NVML events during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "the action comes from the per-XID or per-event table (probes/xid_table.py, "
          "faults/judge_events.py), given as a cause 'table.<action>'; these "
          "defaults are for a finding without one",
          "docs/faults.md#faults-event-kind"),
    Check("faults.gpu_lost", "Faults GPU lost",
          "whether a GPU was lost during the run (the fault watcher beside bench, comm and "
          "stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.DRAIN_NODE},
          "no rule today: gpucheck's fallback for an unknown id (an unexplained failure must not"
          " keep taking jobs)",
          "docs/faults.md#faults-gpu-lost"),
    Check("faults.nvlink.crc", "Faults NVLink crc",
          "NVLink state and CRC/replay counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.REPLACE_HARDWARE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvlink-crc"),
    Check("faults.nvlink.down", "Faults NVLink down",
          "NVLink state and CRC/replay counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvlink-down"),
    Check("faults.nvlink.recovery", "Faults NVLink recovery",
          "NVLink state and CRC/replay counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvlink-recovery"),
    Check("faults.nvlink5", "Faults NVLink5",
          "NVLink5 recovery and error counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/faults.md#faults-nvlink5"),
    Check("faults.nvlink5.errors", "Faults NVLink5 errors",
          "NVLink5 recovery and error counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.REPLACE_HARDWARE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvlink5-errors"),
    Check("faults.nvlink5.recovery", "Faults NVLink5 recovery",
          "NVLink5 recovery and error counters during the run (the fault watcher beside bench, "
          "comm and stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvlink5-recovery"),
    Check("faults.nvml_slow", "Faults NVML slow",
          "how long NVML answered during the run (the fault watcher beside bench, comm and "
          "stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.NONE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-nvml-slow"),
    Check("faults.pcie.replay", "Faults PCIe replay",
          "PCIe replays during the run (the fault watcher beside bench, comm and stress; nvidia-"
          "smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.REPLACE_HARDWARE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-pcie-replay"),
    Check("faults.remapped_rows.failed", "Faults remapped rows failed",
          "row remapping during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.REPLACE_HARDWARE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-remapped-rows-failed"),
    Check("faults.remapped_rows.pending", "Faults remapped rows pending",
          "row remapping during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-remapped-rows-pending"),
    Check("faults.retired_pages", "Faults retired pages",
          "page retirement during the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RESET_GPU, F: A.RESET_GPU},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-retired-pages"),
    Check("faults.summary", "Faults summary",
          "every fault counter of the run (the fault watcher beside bench, comm and stress; "
          "nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/faults.md#faults-summary"),
    Check("faults.watch", "Faults watch",
          "the fault watcher itself (the fault watcher beside bench, comm and stress; nvidia-smi"
          " -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/faults.md#faults-watch"),
    Check("faults.xid", "Faults Xid",
          "Xid and memory events during the run (the fault watcher beside bench, comm and "
          "stress; nvidia-smi -q -d ECC,PAGE_RETIREMENT by hand)",
          {W: A.RERUN},
          "the action comes from the per-XID or per-event table (probes/xid_table.py, "
          "faults/judge_events.py), given as a cause 'table.<action>'; these "
          "defaults are for a finding without one",
          "docs/faults.md#faults-xid"),
    Check("kernel_log.read", "Kernel log read",
          "Xid lines in the kernel log (gpucheck env or health; dmesg | grep -i xid by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/xid.md#kernel-log-read"),
    Check("kernel_log.xid", "Kernel log Xid",
          "Xid lines in the kernel log (gpucheck env or health; dmesg | grep -i xid by hand)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "the action comes from the per-XID or per-event table (probes/xid_table.py, "
          "faults/judge_events.py), given as a cause 'table.<action>'; these "
          "defaults are for a finding without one",
          "docs/xid.md#kernel-log-xid"),
)
# Every id the fault watcher and the kernel-log reader make may carry the action its
# table row names, as the cause "table.<action>" (the site's data, not its words).
_TABLED = ("faults.", "kernel_log.xid")
CHECKS = tuple(replace(c, causes=c.causes + table_causes())
               if c.id.startswith(_TABLED) else c for c in CHECKS)
