"""A report's metrics keyed as compare, fleet and baselines key them (`Metric.key()`:
`<name>[.<position>]`, docs/fleet.md "Metrics"), and its facts: versions, hardware,
environment and run settings (the multi-node env list, `gpucheck.envfacts`, plus setup).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

from gpucheck.envfacts import node_facts
from gpucheck.measure import Better, Metric
from gpucheck.report import Report, Section
from gpucheck.subject import Subject

JUDGED = (Better.HIGHER, Better.LOWER)


def metrics_of(report: Report) -> dict[str, Metric]:
    """Every metric of `report` by key, sorted; the first of two with one key wins (a
    gathered env report names each node's GPUs alike)."""
    found: dict[str, Metric] = {}
    for section in report.sections:
        for metric in section.metrics:
            found.setdefault(metric.key(), metric)
    keys = tuple(found)
    order = _ORDERS.get(keys)
    if order is None:
        order = _ORDERS[keys] = tuple(sorted(found, key=metric_order))
        if len(_ORDERS) > 256:  # a fleet's reports share a few sets of keys
            _ORDERS.clear()
    return found if order == keys else {k: found[k] for k in order}


_ORDERS: dict[tuple[str, ...], tuple[str, ...]] = {}


@functools.lru_cache(maxsize=1 << 16)  # a fleet's reports share their keys
def metric_order(key: str) -> tuple[str, int, str]:
    """How metric keys are listed: by family, then message size as a number (@1024
    before @131072 before @1048576), then position."""
    name, at, rest = key.partition("@")
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not at or not digits or digits > 18:  # a size, not a forged run of digits
        return (key, -1, "")
    return (name, int(rest[:digits]), rest[digits:])


def position(metric: Metric) -> str | None:
    """The GPU slot ("rank3", "gpu5", "cuda0_to_cuda1"); None for a job-wide figure."""
    return metric.subject.position() if metric.subject is not None else None


def family(metric: Metric) -> str:
    """The name without a message size: `comm.all_reduce.busbw_gbps`."""
    return metric.name.split("@", 1)[0]


def judged(metric: Metric) -> bool:
    return metric.better in JUDGED


def rows(value: Any) -> list[Mapping[str, Any]]:
    """The dict rows of a table (a list), skipping anything else."""
    # isinstance(r, dict), not Mapping: JSON gives dicts, and the ABC check is what
    # a thousand-node fleet would spend its time on.
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def slot_words(metric: Metric) -> str | None:
    """How a finding names the figure's slot: the GPU's words when the figure names a
    GPU ("GPU 3 (NVIDIA H200, bus ...)"), else its position ("rank1"); None for the job."""
    who = metric.subject
    if who is None:
        return None
    if who.gpu is not None or who.bus_id or who.uuid:
        return who.label
    return who.position() or who.label


def gpu_words(metric: Metric) -> str | None:
    """The GPU the figure is about, in words, when it names one (the fleet's gpu column)."""
    words = slot_words(metric)
    return words if words is not None and words != position(metric) else None


def slot_subject(metric: Metric) -> Subject | None:
    """The figure's subject, worded as `slot_words` says it (its fields kept)."""
    words = slot_words(metric)
    if metric.subject is None or words is None:
        return None
    who = metric.subject
    return Subject(who.kind, words, rank=who.rank, gpu=who.gpu, bus_id=who.bus_id,
                   uuid=who.uuid, node=who.node, host=who.host, peer=who.peer, port=who.port)


VERSION, HARDWARE, ENVIRONMENT, SETUP = "version", "hardware", "environment", "setup"
KINDS = (VERSION, HARDWARE, ENVIRONMENT, SETUP)
_ENV_KINDS = frozenset({"system", "python", "torch", "driver", "gpus", "environment"})
_HARDWARE = frozenset({"GPU model", "GPU count (torch)", "GPU count (driver)"})
# The setup section's keys that change what a run measures.
_SETUP = {
    "bench": ("model", "dtype", "batch_size", "ranks", "timed_iters", "device", "backend",
              "channels_last"),
    "comm": ("world_size", "nodes", "device", "backend", "sizes", "iters"),
    "stress": ("world_size", "nodes", "device", "backend", "dtypes", "size", "burn_in_s"),
}


class Fact(NamedTuple):
    """One fact: `key` as people read it ("NVIDIA driver version", "bench.batch_size")."""

    key: str
    value: str
    kind: str  # one of KINDS


def extract_facts(report: Report) -> dict[str, Fact]:
    """Every fact of `report`, by key, sorted by key."""
    facts = {"gpucheck version": Fact("gpucheck version", str(report.tool_version), VERSION)}
    facts.update(_env_facts(report.sections))
    for section in report.sections:
        kind = section.name.rsplit(".", 1)[-1]
        if kind in _SETUP:
            facts.update(_setup_facts(kind, section.data))
        elif kind == "timing":
            facts.update(_bench_devices(section.data))
    return dict(sorted(facts.items()))


def _env_facts(sections: list[Section]) -> dict[str, Fact]:
    """envgather's facts, from the first section of each env kind (a combined or
    multi-node report names them "env.driver", "node0.driver")."""
    first: dict[str, Section] = {}
    for section in sections:
        first.setdefault(section.name.rsplit(".", 1)[-1], section)
    if not _ENV_KINDS & first.keys():
        return {}
    plain = {"sections": [{"name": kind, "data": s.data}
                          for kind, s in first.items() if kind in _ENV_KINDS]}
    return {key: Fact(key, value, ENVIRONMENT if key.startswith("$") else
                      HARDWARE if key in _HARDWARE else VERSION)
            for key, value in node_facts(plain).items()}


def _setup_facts(kind: str, data: Mapping[str, Any]) -> dict[str, Fact]:
    facts = {}
    for key in _SETUP[kind]:
        if key in data:
            value = data[key]
            shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            facts[f"{kind}.{key}"] = Fact(f"{kind}.{key}", shown, SETUP)
    return facts


def _bench_devices(data: Mapping[str, Any]) -> dict[str, Fact]:
    """The devices bench's ranks ran on (its report's only GPU model)."""
    devices = sorted({str(r.get("device")) for r in rows(data.get("ranks"))})
    if not devices:
        return {}
    return {"bench.devices": Fact("bench.devices", ", ".join(devices), HARDWARE)}


def fewer_gpus(key: str, kind: str, usual: str | None, value: str | None) -> bool:
    """`value` of a GPU-count fact is fewer than `usual` (or no longer a count)."""
    if kind != HARDWARE or "count" not in key:
        return False
    want, have = _count(usual or ""), _count(value or "")
    return want is not None and (have is None or have < want)


def _count(value: str) -> int | None:
    # ASCII digits only: "²".isdigit() is True but int("²") raises, and a count of
    # thousands of digits is no GPU count (int() refuses over 4300 digits).
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None
