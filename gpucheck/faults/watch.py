"""`FaultWatch`: one GPU's counters before and after a load, its NVML events and clock
reasons sampled by a daemon thread in between; it never raises into the load (without a
GPU or NVML its result says why). docs/faults.md has its result and cost."""

from __future__ import annotations

import datetime as _dt
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gpucheck.devices import GpuIdentity
from gpucheck.faults.clocks import ClockReader, ClockTally, slowdown_ms
from gpucheck.faults.counters import (
    LOST_KINDS,
    EventWatch,
    Snapshot,
    counter_rows,
    link_deltas,
    read_snapshot,
)
from gpucheck.probes.gpus import read_slowdown_ns
from gpucheck.probes.nvml import Nvml, NvmlFailure, decode

RESULT_VERSION = 1
DEFAULT_SAMPLE_S = 0.2
THREAD_NAME = "gpucheck-faultwatch"


class _Metered:
    """The doorway, counting the calls the watcher's thread makes and their wall time."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self.calls = 0
        self.call_s = 0.0
        self.longest_s = 0.0  # the longest single call, queueing included

    @property
    def module(self) -> Any:
        return self._nvml.module

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._nvml.call, name, *args, **kwargs)

    def get(self, name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        return self._timed(self._nvml.get, name, *args, default=default, **kwargs)

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - started
            self.calls += 1
            self.call_s += took
            self.longest_s = max(self.longest_s, took)


class FaultWatch:
    """Watch the GPU at `bus_id` (None on a CPU rank); `nvml`: a shared doorway (a
    private one is started and shut down when None); `rank`, `host`: labels."""

    def __init__(self, bus_id: str | None, nvml: Nvml | None = None,
                 sample_s: float = DEFAULT_SAMPLE_S, rank: int | None = None,
                 host: str | None = None) -> None:
        if sample_s <= 0:
            raise ValueError(f"sample_s must be positive, not {sample_s}")
        self.bus_id, self.rank, self.sample_s = bus_id, rank, sample_s
        self.host = host or socket.gethostname()
        self._given = nvml
        self._door: Nvml | None = None
        self._meter: _Metered | None = None
        self._handle: Any = None
        self._identity: dict[str, Any] = {}
        self._reason: str | None = None
        self._errors: list[dict[str, Any]] = []
        self._before: Snapshot | None = None
        self._after: Snapshot | None = None
        self._events: EventWatch | None = None
        self._event_rows: list[dict[str, Any]] = []
        self._clocks: ClockReader | None = None
        self._tally = ClockTally()
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._window_open, self._marked = True, False
        self._t0: float | None = None  # time.monotonic() at start, stop, and the window's ends
        self._t_end: float | None = None
        self._win_t0: float | None = None
        self._win_t1: float | None = None
        self._slow: dict[str, dict[str, int | None] | None] = {"start": None, "end": None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cost = {"ticks": 0, "nvml_calls": 0, "nvml_call_s": 0.0, "thread_cpu_s": 0.0}
        self._state = "new"
        self._slow_from = 0

    # -- the load command's calls ---------------------------------------------------

    def __enter__(self) -> FaultWatch:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Snapshot the counters, register the events, start the thread (once)."""
        if self._state != "new":
            return
        self._state = "running"
        self._t0 = self._win_t0 = time.monotonic()
        if self.bus_id is None:
            self._reason = "no GPU: this rank runs on the CPU"
            return
        if not self._attach():
            return
        door, meter = self._door, self._meter
        assert door is not None and meter is not None  # _attach set both
        try:
            self._identify()
            self._before = read_snapshot(door, self._handle)
            self._slow["start"] = self._read_slowdown("before the run")
            if self._lost():
                return
            self._events = EventWatch(meter, self._handle)
            self._events.open()
        except NvmlFailure as exc:
            self._record(exc, "before the run")
            return
        self._clocks = ClockReader(meter, self._handle)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def mark_start(self) -> None:
        """The timed loop starts now: clock reasons are counted from here on only."""
        self._safe_drain("at the start of the timed loop")  # earlier events are not in it
        slow = self._read_slowdown("at the start of the timed loop")
        with self._lock:
            self._tally.reset()
            self._window_open, self._marked = True, True
            self._win_t0, self._win_t1 = time.monotonic(), None
            self._slow["start"] = slow

    def mark_end(self) -> None:
        """The timed loop ended now (events are still watched until exit)."""
        with self._lock:
            if not self._window_open:
                return
        self._safe_drain("at the end of the timed loop")  # events queued in the loop are in it
        with self._lock:
            self._window_open, self._win_t1 = False, time.monotonic()
        self._slow["end"] = self._read_slowdown("at the end of the timed loop")

    def stop(self) -> None:
        """Stop the thread, drain the last events, snapshot the counters again (once)."""
        if self._state != "running":
            return
        self._state = "stopped"
        self.mark_end()
        self._stop.set()
        if self._thread is not None:
            budget_s = self.sample_s + (self._door.longest_wait_s if self._door else 3.0) + 1.0
            self._thread.join(budget_s)
            if self._thread.is_alive():
                self._errors.append({"phase": "stopping", "kind": "WatcherStuck",
                                     "function": None, "message": "the watcher thread did not "
                                     f"stop within {budget_s:g} s"})
        self._finish()
        self._t_end = time.monotonic()
        if self._given is None and self._door is not None:
            self._door.shutdown()

    @property
    def clock_samples(self) -> int:
        """Clock-reason samples taken in the current window so far."""
        return self._tally.samples

    # -- inside ---------------------------------------------------------------------

    def _attach(self) -> bool:
        """Start NVML and find the GPU; False (with the n/a reason or error) when not."""
        self._door = self._given or Nvml()
        self._meter = _Metered(self._door)
        # A shared doorway's late calls from before this watch are not this watch's.
        self._slow_from = len(self._door.slow_calls)
        try:
            self._door.start()
        except NvmlFailure as exc:
            self._reason = f"NVML unavailable: {exc.meaning}"
            return False
        try:
            self._handle = self._door.call("nvmlDeviceGetHandleByPciBusId", self.bus_id)
        except NvmlFailure as exc:
            if exc.not_available or exc.kind == "NVMLError_NotFound":
                self._reason = f"NVML has no GPU at bus {self.bus_id} ({exc.meaning})"
            else:
                self._record(exc, "when it was looked up")
            return False
        return True

    def _identify(self) -> None:
        """The GPU's name as every section names it: "GPU 3 (NVIDIA H200, bus ..., GPU-...)"."""
        door, handle = self._door, self._handle
        assert door is not None
        pci = door.get("nvmlDeviceGetPciInfo", handle)
        bus = decode(pci.busId) if pci is not None else self.bus_id
        index = door.get("nvmlDeviceGetIndex", handle)
        identity = GpuIdentity(None, index, door.get("nvmlDeviceGetName", handle), bus,
                               door.get("nvmlDeviceGetUUID", handle))
        self._identity = {"gpu": identity.label(), "nvml_index": index, "nvml_bus_id": bus}

    def _run(self) -> None:
        started_cpu = time.thread_time()
        try:
            while not self._stop.wait(self.sample_s):
                if not self._tick():
                    break
        finally:
            self._cost["thread_cpu_s"] += time.thread_time() - started_cpu

    def _tick(self) -> bool:
        """One poll of the events and one clock sample; False ends the thread."""
        assert self._meter is not None and self._clocks is not None
        calls, call_s = self._meter.calls, self._meter.call_s
        try:
            self._drain_events()
            with self._lock:
                sampling = self._window_open
            if sampling and self._clocks.available:
                mask = self._clocks.read()
                if mask is not None:
                    self._tally.add(mask, self._clocks.sm_ratio(mask))
        except NvmlFailure as exc:
            self._record(exc, "during the run")
            return False
        except Exception as exc:  # a watcher bug must never reach the load
            self._errors.append({"phase": "during the run", "kind": type(exc).__name__,
                                 "function": None, "message": f"watcher error: {exc}"})
            return False
        finally:
            self._cost["ticks"] += 1
            self._cost["nvml_calls"] += self._meter.calls - calls
            self._cost["nvml_call_s"] += self._meter.call_s - call_s
        return True

    def _safe_drain(self, phase: str) -> None:
        """Drain from the caller's thread; a failure is recorded, never raised."""
        if self._handle is None or self._lost():
            return
        try:
            self._drain_events()
        except NvmlFailure as exc:
            self._record(exc, phase)

    def _drain_events(self) -> None:
        """Poll the event set (the thread and mark_* both call it: one at a time)."""
        if self._events is None:
            return
        with self._poll_lock:
            polled = self._events.poll()
        for kind, data in polled:
            with self._lock:
                in_loop = self._marked and self._window_open
            assert self._t0 is not None
            self._event_rows.append({
                "kind": kind, "xid": data if kind == "xid" else None, "data": data,
                "t_s": round(time.monotonic() - self._t0, 3), "in_timed_loop": in_loop,
                "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")})

    def _finish(self) -> None:
        """After the thread: the events queued since its last tick, then the counters.
        Nothing is read from a GPU that was lost (it would only fail again)."""
        try:
            # A handle means _attach opened the door.
            if self._handle is not None and self._door is not None and not self._lost():
                self._drain_events()
                links = self._before.links if self._before is not None else None
                self._after = read_snapshot(self._door, self._handle, links)
        except NvmlFailure as exc:
            self._record(exc, "after the run")
        finally:
            if self._events is not None:
                self._events.close()

    def _read_slowdown(self, phase: str) -> dict[str, int | None] | None:
        if self._handle is None or self._door is None or self._lost():
            return None
        try:
            return read_slowdown_ns(self._door, self._handle)
        except NvmlFailure as exc:  # only a lost GPU is a fault: optional counters are n/a
            if exc.kind in LOST_KINDS:
                self._record(exc, phase)
            return None

    def _lost(self) -> bool:
        return any(e["kind"] in LOST_KINDS for e in self._errors)

    def _record(self, exc: NvmlFailure, phase: str) -> None:
        with self._lock:
            self._errors.append({"phase": phase, "kind": exc.kind, "function": exc.function,
                                 "message": str(exc)})

    # -- the result -----------------------------------------------------------------

    def _window(self) -> dict[str, Any]:
        end = self._win_t1 if self._win_t1 is not None else self._t_end
        window_s = None if end is None or self._win_t0 is None else round(end - self._win_t0, 3)
        available = self._clocks is not None and self._clocks.available
        return {"window": "timed" if self._marked else "watched", "window_s": window_s,
                "samples": self._tally.samples,
                "fractions": self._tally.fractions() if available else None,
                "source": self._clocks.function if self._clocks else None,
                "hw_slowdown": {**self._tally.hw_slowdown(), "sm_clock_max_mhz": (
                    self._clocks.sm_max_mhz if self._clocks else None)},
                "slowdown_ms": slowdown_ms(self._slow["start"], self._slow["end"], window_s)}

    def result(self) -> dict[str, Any]:
        """Everything seen, JSON-able; call after the `with` block (or `stop()`)."""
        watched_s = None if self._t_end is None or self._t0 is None else round(
            self._t_end - self._t0, 3)
        return {
            "version": RESULT_VERSION, "rank": self.rank, "host": self.host,
            "bus_id": self.bus_id, "gpu": self._identity.get("gpu"),
            "nvml_index": self._identity.get("nvml_index"),
            "nvml_bus_id": self._identity.get("nvml_bus_id"),
            "status": "n/a" if self._reason else "watched", "reason": self._reason,
            "watched_s": watched_s,
            "counters": counter_rows(self._before, self._after),
            "nvlink_links_grown": link_deltas(self._before, self._after),
            "events_registered": self._events.registered if self._events else None,
            "events_reason": self._events.reason if self._events else None,
            "events": list(self._event_rows),
            "clocks": self._window(),
            "errors": list(self._errors),
            # NVML calls that answered late (after their budget, within the second one).
            "nvml_slow": [call._asdict() for call in (
                self._door.slow_calls[self._slow_from:] if self._door is not None else [])],
            "cost": {"sample_s": self.sample_s, **{k: round(v, 6) if isinstance(v, float)
                                                   else v for k, v in self._cost.items()},
                     # For the GPU acceptance run: how late NVML answers under this load.
                     "nvml_call_max_s": round(self._meter.longest_s, 6) if self._meter
                     else None},
        }
