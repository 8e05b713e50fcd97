"""A report's non-numeric facts: versions, hardware, environment and run settings.

The versions, GPU models and counts and environment variables that should match
between nodes are the multi-node env comparison's own list
(`gpucheck.envfacts.node_facts`), so `gpucheck env` under torchrun,
compare and fleet agree on what counts as drift. The run settings (batch size,
ranks, message sizes, ...) are added here: two runs that differ in them measure
different things.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.metrics import rows, section_kind
from gpucheck.envfacts import node_facts
from gpucheck.report import Report, Section

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


@dataclass(frozen=True)
class Fact:
    """One fact: `key` as people read it ("NVIDIA driver version", "bench.batch_size")."""

    key: str
    value: str
    kind: str  # one of KINDS


def extract_facts(report: Report) -> dict[str, Fact]:
    """Every fact of `report`, by key, sorted by key."""
    facts = {"gpucheck version": Fact("gpucheck version", str(report.tool_version), VERSION)}
    facts.update(_env_facts(report.sections))
    for section in report.sections:
        kind = section_kind(section.name)
        if kind in _SETUP:
            facts.update(_setup_facts(kind, section.data))
        if kind == "timing":
            facts.update(_bench_devices(section.data))
    return dict(sorted(facts.items()))


def _env_facts(sections: list[Section]) -> dict[str, Fact]:
    """envgather's facts, from the first section of each env kind (a combined or
    multi-node report names them "env.driver", "node0.driver")."""
    first: dict[str, Section] = {}
    for section in sections:
        first.setdefault(section_kind(section.name), section)
    if not _ENV_KINDS & first.keys():
        return {}
    plain = {"sections": [{"name": kind, "data": s.data}
                          for kind, s in first.items() if kind in _ENV_KINDS]}
    return {key: Fact(key, value, _kind_of(key)) for key, value in node_facts(plain).items()}


def _kind_of(key: str) -> str:
    if key.startswith("$"):
        return ENVIRONMENT
    return HARDWARE if key in _HARDWARE else VERSION


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


def gpu_count(value: str) -> int | None:
    """A GPU-count fact as a number (None when it says "None" or anything else)."""
    # ASCII digits only: "²".isdigit() is True but int("²") raises, and a count of
    # thousands of digits is no GPU count (int() refuses over 4300 digits).
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None
