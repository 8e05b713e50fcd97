"""Test-only stand-in for the `pynvml` module in spawned rank processes.

Spawned ranks import their modules fresh, with the launching process's sys.path:
a test that puts this folder first on sys.path and sets GPUCHECK_FAKE_NVML to a
JSON scenario makes `import pynvml` in every rank give a `FakeNvml`
(tests/fake_pynvml.py) built from it:

    {"gpus": [{<FakeGpu field>: <value>, ..., "slowdown_share": {"270": 0.5}}, ...],
     "events": [{"gpu": 1, "type": 8, "data": 79, "on_poll": 1}]}

An event is delivered to GPU `gpu` just before this process's event-set poll number
`on_poll` (from 1) is answered, so it arrives while the watch runs, however fast or
slow the ranks are. `slowdown_share` is `FakeGpu.slowdown_share`: a clock-event reason's
time counter grows at that share of real time. Each rank is its own
process with its own fake: an event on GPU 1 reaches only the rank that watches GPU 1.
Nothing in gpucheck imports this.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.*

from tests.fake_pynvml import FakeGpu, FakeNvml

SCENARIO_VAR = "GPUCHECK_FAKE_NVML"
_SETS = {"unsupported", "hang", "nvlinks_down"}
_TUPLES = {"cc", "util", "pcie_gen", "pcie_width", "remapped"}


def _gpu(fields: dict[str, Any]) -> FakeGpu:
    shares = {int(k): v for k, v in fields.pop("slowdown_share", {}).items()}  # JSON keys
    return FakeGpu(slowdown_share=shares, **{
        k: set(v) if k in _SETS else tuple(v) if k in _TUPLES else v for k, v in fields.items()})


def _deliver_on_polls(fake: FakeNvml, events: list[dict[str, Any]]) -> None:
    """Wrap the event-set wait so each scheduled event lands before its poll."""
    wait = fake.module.nvmlEventSetWait_v2
    polls = [0]

    def counted_wait(event_set: Any, timeoutms: int) -> Any:
        polls[0] += 1
        for event in events:
            if event["on_poll"] == polls[0]:
                fake.deliver_event(event["gpu"], event["type"], event.get("data", 0))
        return wait(event_set, timeoutms)

    fake.module.nvmlEventSetWait_v2 = counted_wait


def _build() -> FakeNvml:
    scenario = json.loads(os.environ.get(SCENARIO_VAR) or "{}")
    fake = FakeNvml([_gpu(g) for g in scenario.get("gpus", [{}])])
    _deliver_on_polls(fake, scenario.get("events", []))
    return fake


FAKE = _build()
FAKE.module.FAKE = FAKE
sys.modules[__name__] = FAKE.module
