"""The two closed lists a finding is made of: its Status and, for a WARN or FAIL, one
Action of seven, which `gpucheck.checks` declares once per check id."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """A check's verdict, ordered from best to worst by `severity` (report.py re-exports
    it; here so gpucheck.checks sits below report.py)."""

    OK = "OK"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.OK: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3}


class Action(str, enum.Enum):
    """The fixed list, from the least to the most disruptive."""

    NONE = "none"  # nothing to do now: information, or a count to watch
    RERUN = "rerun"  # run again: the result may be transient, or names no culprit yet
    FIX_CONFIG = "fix-config"  # software, settings or the launch: the hardware is fine
    RESTART_APP = "restart-app"  # the application's fault; the GPU is healthy
    RESET_GPU = "reset-gpu"  # nvidia-smi -r (or a reboot) clears it; the node may stay
    DRAIN_NODE = "drain-node"  # take the node out of service until someone has looked
    REPLACE_HARDWARE = "replace-hardware"  # a part is bad or unseated: hands on the box


ACTIONS: tuple[str, ...] = tuple(a.value for a in Action)
