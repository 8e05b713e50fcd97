"""Test faults planted into gpucheck from outside the package (docs/DESIGN.md 2.5).

A `Plant` says which faults a run gets (a slow or wrong rank, a slow pair or node, the
fake GPU a rank watches, a short hang margin). `planted(plant)` patches gpucheck's own
functions in this process and puts the plant in the environment, where
tests/plant_site/sitecustomize.py patches the same functions in every Python process the
run starts (the ranks gpucheck spawns, torchrun's). gpucheck has no hook of its own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

VAR = "GPUCHECK_TEST_PLANT"
TESTS = Path(__file__).resolve().parent
SITE = TESTS / "plant_site"

# bench: function(model, rank) -> model, called before DDP wraps the model.
ModelHook = Callable[[Any, int], Any]
# stress and preflight: function(rank, phase, iteration, out) after each timed iteration
# of the GEMM ("gemm"), memory ("membw") and burn-in ("burn"; iteration 0 is the first
# result, the one the later ones are compared with) loops, "gemm.again" etc. when a rank
# is measured again. It may sleep (a slow GPU) or change `out` in place (wrong results).
StressHook = Callable[[int, str, int, Any], None]
Patch = Callable[[Any, str, Any], None]  # setattr, or monkeypatch.setattr


@dataclass(frozen=True)
class SlowPair:
    """Rank `src` sleeps `seconds` before each pairwise send to `dst`. `when`: "always",
    "first" (the first measurement only, not the second look) or "once" (the first
    measurement's first repeat only: one noisy batch)."""

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


@dataclass(frozen=True)
class Plant:
    """The faults of one test run; every field empty: none."""

    model: ModelHook | None = None
    stress: StressHook | None = None
    # PCI bus ids, one per rank (None: its own GPU), that ranks watch instead of their
    # own GPU, so CPU ranks can watch the fake GPUs of tests/fake_nvml_site.
    fault_bus: tuple[str | None, ...] = ()
    slow_pairs: tuple[SlowPair, ...] = ()
    slow_sends: SlowNode | None = None
    slow_recvs: SlowNode | None = None  # gloo: a node that takes its receives in slowly
    # preflight: the hang guard's margin instead of gpucheck.preflight.actions.MARGIN_S.
    hang_margin_s: float | None = None
    extra: dict[str, str] = field(default_factory=dict)  # more environment for the run

    def bus_id(self, rank: int) -> str | None:
        """The bus id this rank watches instead of its own GPU, else None."""
        return self.fault_bus[rank] if 0 <= rank < len(self.fault_bus) else None

    def pair_delay(self, src: int, dst: int, again: bool, repeat: int) -> float:
        """Seconds to sleep before each send of this pairwise batch, else 0."""
        found = (p.delay(src, dst, again, repeat) for p in self.slow_pairs)
        return next((s for s in found if s is not None), 0.0)

    def node_delays(self, node: int, rail: int, again: bool = False) -> tuple[float, float]:
        """Seconds to sleep before each node-to-node send, and before each receive."""
        sends, recvs = (s.delay(node, again, rail) if s is not None else 0.0
                        for s in (self.slow_sends, self.slow_recvs))
        return sends, recvs

    def to_json(self) -> str:
        data = asdict(self)
        data.update(model=_name(self.model), stress=_name(self.stress))
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Plant:
        data = json.loads(text)
        nodes = {k: SlowNode(**data[k]) if data[k] else None for k in ("slow_sends", "slow_recvs")}
        return cls(model=data["model"] and function(data["model"]),
                   stress=data["stress"] and function(data["stress"]),
                   fault_bus=tuple(data["fault_bus"]),
                   slow_pairs=tuple(SlowPair(**p) for p in data["slow_pairs"]),
                   hang_margin_s=data["hang_margin_s"], extra=data["extra"], **nodes)


def function(target: str) -> Any:
    """`module:function` (the tests directory is on the path)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _name(hook: Callable[..., Any] | None) -> str | None:
    return None if hook is None else f"{hook.__module__}:{hook.__qualname__}"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def install(plant: Plant, patch: Patch = setattr) -> None:
    """Patch gpucheck's functions in this process with the plant's faults."""
    if plant.model is not None:
        _plant_model(plant.model, patch)
    if plant.stress is not None:
        _plant_stress(plant.stress, patch)
    if plant.fault_bus:
        _plant_fault_bus(plant, patch)
    if plant.slow_pairs:
        _plant_slow_pairs(plant, patch)
    if plant.slow_sends or plant.slow_recvs:
        _plant_slow_nodes(plant, patch)
    if plant.hang_margin_s is not None:
        from gpucheck.preflight import actions

        patch(actions, "MARGIN_S", plant.hang_margin_s)


@contextlib.contextmanager
def planted(plant: Plant) -> Iterator[Plant]:
    """The plant in this process and in the environment the run's processes inherit;
    everything as it was afterwards."""
    with contextlib.ExitStack() as undo:
        saved = {k: os.environ.get(k) for k in (VAR, "PYTHONPATH", *plant.extra)}
        undo.callback(_restore_environ, saved)
        paths = [str(SITE), str(TESTS), *filter(None, [saved["PYTHONPATH"]])]
        os.environ.update({VAR: plant.to_json(), "PYTHONPATH": os.pathsep.join(paths),
                           **plant.extra})

        def patch(target: Any, name: str, value: Any) -> None:
            undo.callback(setattr, target, name, getattr(target, name))
            setattr(target, name, value)

        install(plant, patch)
        yield plant


def _restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _wrap(patch: Patch, target: Any, name: str,
          wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    real = getattr(target, name)
    patch(target, name, functools.wraps(real)(wrapper(real)))


def _plant_model(hook: ModelHook, patch: Patch) -> None:
    """bench: the hook sees the model the worker builds (not the consistency check's)."""
    from gpucheck.bench import model, worker

    class Models:
        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        @staticmethod
        def build_model(*args: Any, **kwargs: Any) -> Any:
            return hook(model.build_model(*args, **kwargs), _rank())

    patch(worker, "bench_model", Models())


def _plant_stress(hook: StressHook, patch: Patch) -> None:
    from gpucheck.stress import burn, gemm, worker

    again = [False]

    def phase(name: str) -> str:
        return name + ".again" if again[0] else name

    def timed_window(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_window(step: Callable[[int], None], *args: Any, **kwargs: Any) -> Any:
            # measure_gemm's step writes `out`, measure_copy's `dst`.
            name = {"measure_gemm": "gemm", "measure_copy": "membw"}[
                step.__qualname__.split(".")[0]]
            cells = dict(zip(step.__code__.co_freevars,
                             (c.cell_contents for c in step.__closure__ or ()), strict=True))
            out = cells.get("out", cells.get("dst"))

            def planted_step(i: int) -> None:
                step(i)
                hook(_rank(), phase(name), i, out)
            return real(planted_step, *args, **kwargs)
        return planted_window

    def counter(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_counter(golden: Any, *args: Any) -> Callable[[Any], Any]:
            hook(_rank(), phase("burn"), 0, golden)  # the first result
            count, done = real(golden, *args), [0]

            def planted_count(out: Any) -> Any:
                done[0] += 1
                hook(_rank(), phase("burn"), done[0], out)
                return count(out)
            return planted_count
        return planted_counter

    def measured_again(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_again(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(real).bind(*args, **kwargs)
            measure = bound.arguments["measure"]

            def flagged() -> Any:
                again[0] = True
                try:
                    return measure()
                finally:
                    again[0] = False
            bound.arguments["measure"] = flagged
            return real(*bound.args, **bound.kwargs)
        return planted_again

    _wrap(patch, gemm, "timed_window", timed_window)
    _wrap(patch, burn, "_mismatch_counter", counter)
    _wrap(patch, worker, "_again", measured_again)


def _plant_fault_bus(plant: Plant, patch: Patch) -> None:
    """Ranks watch the plant's bus ids (an NVML doorway opened for it on CPU ranks)."""
    from gpucheck.devices import GpuIdentity
    from gpucheck.distributed import faultwatch
    from gpucheck.distributed.faultwatch import RankFaults

    def start(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_start(self: RankFaults, world: Any, gpu: Any, enabled: bool) -> None:
            bus = plant.bus_id(world.rank)
            if bus and enabled:
                gpu = replace(gpu, pci_bus_id=bus) if gpu else \
                    GpuIdentity(None, None, None, bus, None)
                self.nvml = self.nvml or faultwatch.Nvml()  # closed with the watch
            real(self, world, gpu, enabled)
        return planted_start

    _wrap(patch, RankFaults, "start", start)


def _sleeping(launch: Callable[[], Any], seconds: float) -> Callable[[], Any]:
    def slowed() -> Any:
        time.sleep(seconds)
        return launch()
    return slowed


def _plant_slow_pairs(plant: Plant, patch: Patch) -> None:
    """The sender of a slow pair sleeps before each send of a timed batch (not the
    warm-up's, the first `_side` of a pair)."""
    from gpucheck.comm import pairwise

    batch: dict[str, Any] = {"again": False, "sides": 0}

    def steps(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_steps(*args: Any, **kwargs: Any) -> Any:
            batch["again"] = inspect.signature(real).bind(*args, **kwargs).arguments["again"]
            return real(*args, **kwargs)
        return planted_steps

    def samples(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_samples(*args: Any, **kwargs: Any) -> Any:
            batch["sides"] = 0
            return real(*args, **kwargs)
        return planted_samples

    def side(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_side(me: int, src: int, dst: int, buf: Any, ack: Any,
                         iters: int) -> list[Callable[[], Any]]:
            launches = real(me, src, dst, buf, ack, iters)
            repeat, batch["sides"] = batch["sides"] - 1, batch["sides"] + 1
            delay = plant.pair_delay(src, dst, batch["again"], repeat)
            if me != src or repeat < 0 or not delay:
                return launches
            return [_sleeping(f, delay) for f in launches[:iters]] + launches[iters:]
        return planted_side

    _wrap(patch, pairwise, "_run_steps", steps)
    _wrap(patch, pairwise, "_time_pair_samples", samples)
    _wrap(patch, pairwise, "_side", side)


class _SlowWork:
    def __init__(self, work: Any, seconds: float) -> None:
        self.work, self.seconds = work, seconds

    def wait(self, *args: Any) -> Any:
        time.sleep(self.seconds)
        return self.work.wait(*args)


def _plant_slow_nodes(plant: Plant, patch: Patch) -> None:
    """gloo: a slow node's ranks sleep before each timed send (and receive) between
    nodes; the untimed warm-up exchange is not slowed."""
    import torch.distributed as dist

    from gpucheck.comm import internode
    from gpucheck.distributed.nodes import group_by_node

    delays = [0.0, 0.0]

    def measure(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_measure(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(real).bind(*args, **kwargs)
            nodes = list(group_by_node(bound.arguments["roster"]).values())
            me = dist.get_rank()
            mine = next(i for i, ranks in enumerate(nodes) if me in ranks)
            delays[:] = plant.node_delays(mine, nodes[mine].index(me),
                                          again=bound.arguments["again"])
            try:
                return real(*args, **kwargs)
            finally:
                delays[:] = [0.0, 0.0]
        return planted_measure

    def samples(real: Callable[..., Any]) -> Callable[..., Any]:
        def planted_samples(*args: Any, **kwargs: Any) -> Any:
            if str(dist.get_backend()) == "nccl" or not any(delays):
                return real(*args, **kwargs)
            isend, wait_all = dist.isend, internode._wait_all
            if delays[0]:
                dist.isend = lambda *a, **k: (time.sleep(delays[0]), isend(*a, **k))[1]
            if delays[1]:
                internode._wait_all = lambda works, ended: wait_all(
                    [_SlowWork(w, delays[1]) for w in works], ended)
            try:
                return real(*args, **kwargs)
            finally:
                dist.isend, internode._wait_all = isend, wait_all
        return planted_samples

    _wrap(patch, internode, "_measure", measure)
    _wrap(patch, internode, "_samples", samples)
