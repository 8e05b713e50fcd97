"""What one process of a run is given, passed in rather than read from globals or the
environment: `RunOptions` (the same on every rank, pickled beside the job spec), the
process's `Console`, and `RunContext`, the state one process holds (docs/DESIGN.md 2.5).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TextIO

from gpucheck.devices import GpuIdentity, RankInfo

if TYPE_CHECKING:
    from torch._C._distributed_c10d import ProcessGroup, Store

    from gpucheck.report import Report

Json = dict[str, object]  # one JSON object, as the run directory's files hold it


@dataclass(frozen=True)
class RunOptions:
    """Settings of the whole run, the same on every rank (picklable: they cross into
    the ranks gpucheck starts)."""

    # The job's run directory (distributed.progress): the user's (GPUCHECK_RUN_DIR, read
    # once by cli.context), else for the ranks gpucheck starts the one run_job made.
    run_dir: str | None = None
    # Progress on stderr (distributed.progress), decided once by cli.context.
    show_progress: bool = False


@dataclass(frozen=True)
class Console:
    """This process's terminal, read once where the process starts (cli.main, a
    spawned rank) and passed down, as httpie's Environment is."""

    stdout: TextIO
    stderr: TextIO
    stdout_tty: bool = False
    stderr_tty: bool = False
    no_color: bool = False  # NO_COLOR is set (no-color.org)

    @classmethod
    def of_process(cls, environ: Mapping[str, str] | None = None) -> Console:
        environ = os.environ if environ is None else environ
        return cls(sys.stdout, sys.stderr, _isatty(sys.stdout), _isatty(sys.stderr),
                   "NO_COLOR" in environ)

    @property
    def color(self) -> bool:
        """Colour on stdout: a terminal, and no NO_COLOR."""
        return self.stdout_tty and not self.no_color

    def columns(self, stream: TextIO) -> int | None:
        """A terminal's own width (`stream` is stdout or stderr), else None: off a
        terminal, or a pty that reports 0 columns."""
        if not (self.stdout_tty if stream is self.stdout else self.stderr_tty):
            return None
        try:
            return os.get_terminal_size(stream.fileno()).columns or None
        except (OSError, ValueError):
            return None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


@dataclass
class Progress:
    """What this rank has done so far (distributed.progress): its step, the reporting
    rank's partial results, each survivor's diagnosis, every rank's own figures."""

    step: str | None = None
    partial: Json | None = None
    diagnoses: list[Json] = field(default_factory=list)
    ranks: dict[int, Json] = field(default_factory=dict)


@dataclass
class Session:
    """The process group this rank was last in (distributed.session), kept after the
    group so a command can still coordinate its ranks."""

    roster: list[RankInfo] = field(default_factory=list)
    gpu: GpuIdentity | None = None
    store: Store | None = None
    # gpucheck's own deadline on a host wait (distributed.deadline), the NCCL settings it
    # chose, and whether a failed NCCL group was aborted (the process then os._exits).
    wait_s: float = 0.0
    backstop: dict[str, str] = field(default_factory=dict)
    aborted: bool = False
    # This rank's fault watch while in the group (distributed.faultwatch.RankFaults).
    faults: object | None = None
    # The gloo group for object collectives beside an NCCL group (distributed.session).
    objects: ProcessGroup | None = None


@dataclass
class Outcome:
    """How one command of `gpucheck all` went: ran, skipped, failed or not run, and why."""

    command: str
    outcome: str
    why: str = ""
    wall_s: float | None = None
    report: Report | None = None


@dataclass
class AllRun:
    """`gpucheck all` so far, for its partial report after a stop."""

    outcomes: list[Outcome] = field(default_factory=list)
    current: str | None = None
    namespaces: dict[str, argparse.Namespace] = field(default_factory=dict)


class Bar(Protocol):
    """An open progress bar (distributed.progress.Bar)."""

    def describe(self, text: str) -> None: ...

    def write_above(self, text: str) -> bool: ...


@dataclass
class RunContext:
    """One process's view of the run: `cli.main` makes it for the command,
    `distributed.job` for each rank gpucheck starts."""

    options: RunOptions = field(default_factory=RunOptions)
    # The environment whose launcher variables (torchrun's, SLURM's) place this process
    # in a job, read once where it starts; `all --local` gives its commands one without.
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    console: Console = field(default_factory=Console.of_process)
    progress: Progress = field(default_factory=Progress)
    session: Session = field(default_factory=Session)
    bars: list[Bar] = field(default_factory=list)  # innermost last
    all_run: AllRun = field(default_factory=AllRun)
    # The command's namespace on the job's store (`all` runs several groups on one).
    scope: tuple[str, ...] = ()
    # Library warnings caught on the ranks (distributed.progress); shared by `scoped`.
    warnings: list[Json] = field(default_factory=list)

    def scoped(self, name: str) -> RunContext:
        """This context for one command of a sequence (progress, session, bars shared)."""
        return replace(self, scope=(*self.scope, name))
