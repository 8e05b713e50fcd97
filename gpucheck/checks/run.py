"""Checks of the run area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Check

A, W, F = Action, Status.WARN, Status.FAIL

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
