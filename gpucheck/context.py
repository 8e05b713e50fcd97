"""What a run is given, passed in rather than read from module globals or the
environment (issue 25, docs/DESIGN.md 2.5).

`RunOptions` crosses into every rank beside the job spec (pickled by torch's elastic
launcher, so everything in it must be picklable: module-level functions, frozen
dataclasses). `TestHooks` is set only by the test suite (tests/hooked.py builds it
and calls `gpucheck.cli.program`); production code never fills it, and never
imports code named by an environment variable. `RunContext` is what one process of
the run holds: `cli.program` makes it for the command, `distributed.job` for each
rank's worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the rank's frame sets it; this module stays below distributed/
    from gpucheck.distributed.faultwatch import RankFaults

# bench: function(model, rank) -> model, called before DDP wraps the model.
ModelHook = Callable[[Any, int], Any]
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
    """Settings of the whole run, the same on every rank."""

    hooks: TestHooks = field(default_factory=TestHooks)
    # The job's run directory (distributed.progress): the one the user named to keep
    # (GPUCHECK_RUN_DIR, read once by cli.program), else for the ranks gpucheck starts
    # the one run_job made; never read from the environment of the ranks.
    run_dir: str | None = None
    # Progress on stderr (distributed.terminal): decided once by cli.program (a
    # terminal, no --quiet), so the ranks gpucheck starts show it as the launcher does.
    show_progress: bool = False


@dataclass
class Progress:
    """What this rank has done so far (distributed.progress writes and reads it): the
    step it is in, the reporting rank's partial results, each survivor's diagnosis of
    a failure, and every rank's own figures."""

    step: str | None = None
    partial: dict[str, Any] | None = None
    diagnoses: list[dict[str, Any]] = field(default_factory=list)
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Session:
    """The process group this rank was last in (distributed.session): the roster of
    its check-in, this rank's GPU and the job's store, kept after the group so a
    command can still coordinate its ranks."""

    roster: list[Any] = field(default_factory=list)
    gpu: Any = None  # gpucheck.devices.GpuIdentity on CUDA, else None
    store: Any = None
    # gpucheck's own deadline on a host wait in the group (the command's timeout:
    # distributed.deadline), the NCCL settings it chose where the user had none, and
    # whether a failed NCCL group was aborted (the process then ends through os._exit).
    wait_s: float = 0.0
    backstop: dict[str, str] = field(default_factory=dict)
    aborted: bool = False


@dataclass
class AllRun:
    """`gpucheck all` so far, for its partial report after a stop: each command's
    outcome, the command running now, and every command's parsed options."""

    outcomes: list[Any] = field(default_factory=list)
    current: str | None = None
    namespaces: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunContext:
    """One process's view of the run."""

    options: RunOptions = field(default_factory=RunOptions)
    # The environment whose launcher variables (torchrun's RANK, WORLD_SIZE, ...,
    # SLURM's) place this process in a job: the process's own, read once where it
    # starts (cli.program, a rank gpucheck started); `all --local` gives its commands
    # one without them. distributed.world.world_of reads the world from it. Empty: a
    # process started on its own.
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    session: Session = field(default_factory=Session)
    # The progress bars open in this process, innermost last (distributed.terminal).
    bars: list[Any] = field(default_factory=list)
    all_run: AllRun = field(default_factory=AllRun)  # filled by `gpucheck all` only
    # The command's namespace on the job's store (`gpucheck all` runs several process
    # groups in turn on one store): distributed.session.scoped_store.
    scope: tuple[str, ...] = ()
    # This rank's fault watch while it is in a process group (distributed.session).
    faults: RankFaults | None = None
    # Library warnings caught on the ranks, for the report's log (distributed.caught);
    # shared by the contexts `scoped` makes, so `all` reports them once.
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def scoped(self, name: str) -> RunContext:
        """This context for one command of a sequence (the same options and run: the
        progress, session and bars are shared, not copied)."""
        return replace(self, scope=(*self.scope, name))

    @property
    def hooks(self) -> TestHooks:
        return self.options.hooks
