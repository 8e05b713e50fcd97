"""Checks of the health area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("health.state", "Health state",
          "whether the state dir can be read and written (gpucheck health)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE},
          "WARN: the state could not be written: disk space or rights; the checks themselves "
          "ran; FAIL: a state that could not be read may have held a fault that never clears "
          "by itself: the node is not known to be healthy until an administrator clears it",
          "docs/health.md#health-state"),
    Check("ib.port.link_downed", "InfiniBand port link downed",
          "each port's link-downed counter since the last check (gpucheck health; ibstat by "
          "hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "the link went down and retrained since the last check: a flapping link breaks NCCL "
          "jobs at random until it is looked at",
          "docs/health.md#ib-port-link-downed"),
    Check("ib.port.rate", "InfiniBand port rate",
          "each port's rate against its peers (gpucheck health; ibstat by hand)",
          {W: A.REPLACE_HARDWARE, F: A.REPLACE_HARDWARE},
          "a port trained to a lower rate than its peers: a cable, transceiver or switch port to"
          " reseat or replace; as gpu.pcie.width",
          "docs/health.md#ib-port-rate"),
    Check("ib.port.state", "InfiniBand port state",
          "each port's state (gpucheck health; ibstat by hand)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE},
          "WARN: a port never seen active is down or not configured: an unused port to disable "
          "or ignore, or a subnet manager to start; FAIL: a port this node has seen active is "
          "down: NCCL over that rail fails or falls back until the link is fixed",
          "docs/health.md#ib-port-state"),
    Check("ib.ports", "InfiniBand ports",
          "the number of active InfiniBand/RoCE ports (gpucheck health; ibstat by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "fewer active InfiniBand/RoCE ports than the node should have: multi-node jobs lose a "
          "rail or cannot start",
          "docs/health.md#ib-ports"),
)
