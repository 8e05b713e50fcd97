"""Checks of the bench area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import NEVER_DRAIN, Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("bench.consistency", "Bench consistency",
          "the logits every rank computed for the same input (gpucheck bench)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "WARN: ranks disagree and nothing names the odd one: more GPUs decide; FAIL: a rank "
          "computed wrong logits: a GPU that gives wrong answers must not take jobs until "
          "diagnosed (dcgmi diag)",
          "docs/bench.md#bench-consistency",
          causes=(
              Cause("all_alike", A.FIX_CONFIG,
                    "every rank is wrong alike: the software stack or the tolerance, not a GPU"),)),
    Check("bench.cpu_relayout", "Bench CPU relayout",
          "how CPU ranks were laid out (gpucheck bench)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/bench.md#bench-cpu-relayout"),
    Check("bench.cpu_rotation", "Bench CPU rotation",
          "how CPU ranks were laid out (gpucheck bench)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/bench.md#bench-cpu-rotation"),
    Check("bench.images.share", "Bench images share",
          "the input images read by each rank (gpucheck bench)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/bench.md#bench-images-share"),
    Check("bench.images.skipped", "Bench images skipped",
          "the input images read by each rank (gpucheck bench)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "an unreadable input image: fix or remove the file",
          "docs/bench.md#bench-images-skipped"),
    Check("bench.node.slow", "Bench node slow",
          "each node's throughput against the others' (gpucheck bench)",
          {W: A.RERUN, F: A.RERUN},
          "a slow node in one short measurement: contention from other jobs, a cold start or the"
          " host's CPU can explain it, so confirm before acting; the hint says where to look "
          "when it repeats",
          "docs/bench.md#bench-node-slow"),
    Check("bench.rank.straggler", "Bench rank straggler",
          "each rank's pace against the others' (gpucheck bench)",
          {W: A.RERUN, F: A.RERUN},
          "a slow rank in one short measurement: contention from other jobs, a cold start or the"
          " host's CPU can explain it, so confirm before acting; the hint says where to look "
          "when it repeats",
          "docs/bench.md#bench-rank-straggler",
          causes=(
              Cause("host_stall", A.FIX_CONFIG,
                    "the rank computed at speed and held the job back because its host did not "
                    "run it (a CPU quota, a competing or stopped process, a data loader): the "
                    "host's settings or load, not the hardware"),),
          # One short run never drains a node: a stall seen again in a second loop is a
          # host to fix (the host_stall cause) or, for a slow device, a rerun to confirm.
          on_look=NEVER_DRAIN),
)
