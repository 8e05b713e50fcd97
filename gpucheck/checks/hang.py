"""Checks of the hang area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("hang.discovery", "Hang discovery",
          "the jobs and stacks on this node (gpucheck hang; py-spy dump by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/hang.md#hang-discovery"),
    Check("hang.jobs", "Hang jobs",
          "the jobs and stacks on this node (gpucheck hang; py-spy dump by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/hang.md#hang-jobs"),
    Check("hang.rank.d_state", "Hang rank d state",
          "a rank's process state (uninterruptible sleep) (gpucheck hang; py-spy dump by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "a process in uninterruptible sleep for the whole window waits on a driver or file-"
          "system call that does not return: the node needs a look (dmesg), and the next job "
          "would hang the same way",
          "docs/hang.md#hang-rank-d-state"),
    Check("hang.rank.unreadable", "Hang rank unreadable",
          "whether a waited-for rank's stack can be read (gpucheck hang; py-spy dump by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the others wait for a rank whose stack could not be read: grant the ptrace capability"
          " and look again",
          "docs/hang.md#hang-rank-unreadable"),
    Check("hang.rank.{state}", "Hang rank <state>",
          "the rank the others wait for, and what it is doing (gpucheck hang; py-spy dump by "
          "hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the job cannot go on without this rank (dead, stopped, in its own code or another "
          "collective): restart the job once its log or stack says why; the GPU is not blamed, "
          "the fault findings would",
          "docs/hang.md#hang-rank-state"),
    Check("hang.stack", "Hang stack",
          "the jobs and stacks on this node (gpucheck hang; py-spy dump by hand)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/hang.md#hang-stack"),
    Check("hang.traces.agree", "Hang traces agree",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-agree"),
    Check("hang.traces.armed", "Hang traces armed",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-armed"),
    Check("hang.traces.desync", "Hang traces desync",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-desync"),
    Check("hang.traces.missing", "Hang traces missing",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-missing"),
    Check("hang.traces.no_dump", "Hang traces no dump",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-no-dump"),
    Check("hang.traces.split", "Hang traces split",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-split"),
    Check("hang.traces.{kind}", "Hang traces <kind>",
          "the NCCL Flight Recorder dumps of the job (gpucheck hang; py-spy dump by hand)",
          {W: A.RESTART_APP, F: A.RESTART_APP},
          "the dumps show ranks that disagree on the collectives or never reached one: the "
          "program's order of collectives or a rank that stopped: fix or restart the job",
          "docs/hang.md#hang-traces-kind"),
    Check("hang.verdict", "Hang verdict",
          "whether a job on this node is stuck (gpucheck hang; py-spy dump by hand)",
          {W: A.RERUN, F: A.RERUN},
          "stuck, but no rank of this node to blame: look at every node at once (or read the "
          "Flight Recorder dumps) to find it",
          "docs/hang.md#hang-verdict"),
)
