"""What one process of a run is given, passed in rather than read from globals or the
environment: `RunOptions` (the same on every rank, pickled beside the job spec), the
process's `Console`, and `RunContext`, the state one process holds (docs/DESIGN.md 2.5).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from gpucheck.devices import GpuIdentity, RankInfo

if TYPE_CHECKING:
    from torch._C._distributed_c10d import ProcessGroup, Store

    from gpucheck.report import Report

Json = dict[str, object]  # one JSON object, as the run directory's files hold it

# bench: function(model, rank) -> model, called before DDP wraps the model.
ModelHook = Callable[[Any, int], Any]  # test faults: set by tests/hooked.py only
# stress: function(rank, phase, iteration, out) after each timed iteration of the
# GEMM ("gemm"), memory ("membw") and burn-in ("burn") loops; it may sleep (a slow
# GPU) or change `out` in place (a GPU computing wrong results).
StressHook = Callable[[int, str, int, Any], None]


@dataclass(frozen=True)
class SlowPair:
    """Rank `src` sleeps `seconds` before each pairwise send to `dst`. `when`:
    "always", "first" (the first measurement only, not the second look) or "once"
    (the first measurement's first repeat only: one noisy batch)."""

    src: int
    dst: int
    seconds: float
    when: str = "always"

    def delay(self, src: int, dst: int, again: bool, repeat: int) -> float | None:
        """Seconds for this batch when it is this pair's, else None."""
        if (self.src, self.dst) != (src, dst):
            return None
        slowed = self.when == "always" or (not again and (self.when == "first" or repeat == 0))
        return self.seconds if slowed else 0.0


@dataclass(frozen=True)
class SlowNode:
    """The ranks of node `node` (only its local rank `rail` when set) sleep `seconds`
    before each node-to-node send (or receive); `first_only`: not in the second look."""

    node: int
    seconds: float
    rail: int | None = None
    first_only: bool = False

    def delay(self, node: int, again: bool, rail: int) -> float:
        if node != self.node or (again and self.first_only) or \
                (self.rail is not None and self.rail != rail):
            return 0.0
        return self.seconds


def _pair_delay(pairs: tuple[SlowPair, ...], src: int, dst: int, again: bool,
                repeat: int) -> float:
    for pair in pairs:
        seconds = pair.delay(src, dst, again, repeat)
        if seconds is not None:
            return seconds
    return 0.0


@dataclass(frozen=True)
class TestHooks:
    """Faults planted by tests; every field empty in production."""

    __test__ = False  # not a pytest test class, whatever its name

    model: ModelHook | None = None
    stress: StressHook | None = None
    # PCI bus ids, one per rank (None: its own GPU), that ranks watch instead of their
    # own GPU, so CPU ranks can watch the fake GPU of tests/fake_nvml_site.
    fault_bus: tuple[str | None, ...] = ()
    slow_pairs: tuple[SlowPair, ...] = ()
    slow_sends: SlowNode | None = None
    # gloo: a node that takes its receives in slowly (a slow receiving NIC).
    slow_recvs: SlowNode | None = None
    # preflight: the hang guard's margin instead of gpucheck.preflight.guard.MARGIN_S,
    # so a test of a stopped rank 0 ends in seconds, not half a minute.
    hang_margin_s: float | None = None

    def bus_id(self, rank: int) -> str | None:
        """The bus id this rank watches instead of its own GPU, else None."""
        return self.fault_bus[rank] if 0 <= rank < len(self.fault_bus) else None

    def pair_delay(self, src: int, dst: int, again: bool, repeat: int) -> float:
        """Seconds to sleep before each send of this pairwise batch, else 0."""
        return _pair_delay(self.slow_pairs, src, dst, again, repeat)

    def node_delays(self, node: int, rail: int, again: bool = False) -> tuple[float, float]:
        """Seconds to sleep before each node-to-node send, and before each receive."""
        sends, recvs = (s.delay(node, again, rail) if s is not None else 0.0
                        for s in (self.slow_sends, self.slow_recvs))
        return sends, recvs


NO_HOOKS = TestHooks()  # frozen: production's one value


@dataclass(frozen=True)
class RunOptions:
    """Settings of the whole run, the same on every rank (picklable: they cross into
    the ranks gpucheck starts)."""

    hooks: TestHooks = field(default_factory=TestHooks)
    # The job's run directory (distributed.progress): the user's (GPUCHECK_RUN_DIR, read
    # once by cli.program), else for the ranks gpucheck starts the one run_job made.
    run_dir: str | None = None
    # Progress on stderr (distributed.terminal), decided once by cli.program.
    show_progress: bool = False


@dataclass(frozen=True)
class Console:
    """This process's terminal, read once where the process starts (cli.program, a
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
    """An open progress bar (distributed.terminal.Bar)."""

    def describe(self, text: str) -> None: ...

    def write_above(self, text: str) -> bool: ...


@dataclass
class RunContext:
    """One process's view of the run: `cli.program` makes it for the command,
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

    @property
    def hooks(self) -> TestHooks:
        return self.options.hooks
