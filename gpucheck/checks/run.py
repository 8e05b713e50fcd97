"""Checks of the run area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import SLOW_TWICE, Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL
# The preflight ids came with no rule of their own: they keep the action gpucheck gave
# an id no rule knew, so that this move changes no action (issue 25).
_UNRULED = ("no action was declared for it before issue 25: the one gpucheck gave an id "
            "no rule knew (a FAIL drains: an unexplained failure must not keep taking "
            "jobs; a WARN is run again)")

CHECKS: tuple[Check, ...] = (
    Check("all.{command}.failed", "All <command> failed",
          "how each command of gpucheck all ended (gpucheck all)",
          {W: A.RERUN, F: A.RERUN},
          "one command of `gpucheck all` stopped with an error, the others ran: run that command"
          " alone to see the whole error",
          "docs/all.md#all-command-failed"),
    Check("all.{command}.{outcome}", "All <command> <outcome>",
          "how each command of gpucheck all ended (gpucheck all)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/all.md#all-command-outcome"),
    Check("launch.cpu_ranks", "Launch CPU ranks",
          "CPU ranks against the host's cores (every distributed command at launch)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "more CPU ranks than cores is a launch setting",
          "docs/all.md#launch-cpu-ranks"),
    Check("ranks.numa", "Ranks NUMA",
          "each rank's CPU binding against its GPU's NUMA node (every distributed command at "
          "launch; numactl --show by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "CPU binding of the ranks is a launch setting",
          "docs/all.md#ranks-numa"),
    Check("{command}.checkin", "<command> checkin",
          "whether every rank started and reached the rendezvous (every command: how the run "
          "itself ended)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "a rank never started or never reached the rendezvous: the launch (every node started,"
          " the same endpoint) is wrong, and running the same command again fails the same way",
          "docs/all.md#command-checkin"),
    Check("{command}.failed", "<command> failed",
          "whether the run finished, when no rank is to blame (every command: how the run itself"
          " ended)",
          {W: A.RERUN, F: A.RERUN},
          "the run failed with no rank to blame: read the ranks' output, then run again",
          "docs/all.md#command-failed"),
    Check("{command}.flight_recorder", "<command> Flight Recorder dumps",
          "where the survivors' NCCL Flight Recorder dumps went after a failure, or why a "
          "rank wrote none (gpucheck hang --traces DIR reads them)",
          {},
          "OK and SKIP only: where the dumps are, never a verdict",
          "docs/hang.md#command-flight-recorder"),
    Check("preflight.nvml", "Preflight NVML",
          "the GPUs through NVML on each rank before the job starts (gpucheck preflight; "
          "gpucheck env on the node by hand)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          _UNRULED,
          "docs/preflight.md#preflight-nvml"),
    Check("preflight.budget", "Preflight budget",
          "which checks finished within --budget (gpucheck preflight --budget S)",
          {W: A.RERUN, F: A.FIX_CONFIG},
          "a check left unfinished (a FAIL only under --strict) says the budget was short "
          "for this job, not that a node is bad: give a larger --budget",
          "docs/preflight.md#preflight-budget"),
    Check("preflight.alloc", "Preflight allocation",
          "one large allocation and write on each rank's GPU (gpucheck preflight)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          _UNRULED,
          "docs/preflight.md#preflight-alloc"),
    Check("preflight.links", "Preflight links",
          "each node's links to its neighbours before the job starts (gpucheck preflight)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "a link of this node failed the gate: the node must not take the job until "
          "someone has looked (the site passes drain-node)",
          "docs/preflight.md#preflight-links"),
    Check("preflight.node", "Preflight node",
          "every check of one node, the node named when it failed (gpucheck preflight)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "a node that failed the gate must not take the job until someone has looked "
          "(the site passes drain-node)",
          "docs/preflight.md#preflight-node"),
    Check("preflight.go", "Preflight go",
          "whether every rank passed the gate and the command starts (gpucheck preflight)",
          {},
          "OK only: the go; a no-go is preflight.no_go or the failing node's finding",
          "docs/preflight.md#preflight-go"),
    Check("preflight.node_all_reduce", "Preflight node all_reduce",
          "each node's intra-node all_reduce bus bandwidth against the others', a slow one "
          "measured again beside a known-good node (gpucheck preflight)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "slow twice, the second time beside a known-good node, on GPU ranks: the node's "
          "links or GPUs are the suspect and it must not take the job (FAIL); slow once, "
          "or on CPU ranks, names nothing (WARN, rerun); the site passes these actions",
          "docs/preflight.md#preflight-node-all-reduce",
          causes=(Cause("cpu_ranks", A.RERUN, "CPU ranks: a slow node is the machine's "
                        "load, not its links"),),
          on_look=SLOW_TWICE),
    Check("preflight.no_go", "Preflight no-go",
          "the gate failed without naming a node (gpucheck preflight)",
          {W: A.RERUN, F: A.RERUN},
          "nothing points at a node (ranks alike wrong, an agreement that failed): there is "
          "no node to drain; read the findings, then run again",
          "docs/preflight.md#preflight-no-go"),
    Check("{command}.interrupted", "<command> interrupted",
          "whether the run was stopped before its end (Ctrl-C, a time limit) (every command: how"
          " the run itself ended)",
          {W: A.RERUN, F: A.RERUN},
          "the run was stopped (Ctrl-C, a time limit): nothing was judged wrong, the rest was "
          "not measured",
          "docs/all.md#command-interrupted"),
    Check("{command}.probe", "<command> probe",
          "whether a probe ran to its end (a crash or a hang of gpucheck's own code) (every "
          "command: how the run itself ended)",
          {W: A.RERUN, F: A.RERUN},
          "a probe crashed or hung: gpucheck's own trouble, not a verdict on the machine; run "
          "again and report a bug if it repeats",
          "docs/all.md#command-probe"),
    Check("{command}.rank_failed", "<command> rank failed",
          "whether every rank ran to its end (every command: how the run itself ended)",
          {W: A.RERUN, F: A.RERUN},
          "a rank exited early, often because another one stopped answering; the hardware "
          "findings (faults, XIDs) carry their own actions",
          "docs/all.md#command-rank-failed"),
    Check("{command}.shared_gpu", "<command> shared GPU",
          "whether two ranks picked one GPU (every distributed command at launch; "
          "CUDA_VISIBLE_DEVICES and the launcher's GPU binding by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "two ranks picked one GPU (the launch's GPU binding or CUDA_VISIBLE_DEVICES "
          "overlaps): the launch is wrong, not the GPU",
          "docs/all.md#command-shared-gpu"),
    Check("{command}.rank_unresponsive", "<command> rank unresponsive",
          "whether every rank kept answering (every command: how the run itself ended)",
          {W: A.RERUN, F: A.RERUN},
          "a rank stopped answering and was killed; the fault watcher and kernel log say whether"
          " its GPU hung",
          "docs/all.md#command-rank-unresponsive"),
)
