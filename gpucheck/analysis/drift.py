"""Software and configuration drift: what most nodes have, and the nodes that differ.

Judged within one command's reports (an env report's driver against the other env
reports'), among the nodes whose report states the fact at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.facts import HARDWARE, gpu_count
from gpucheck.analysis.nodes import NodeReport, Reason

SHOWN_NODES = 8  # nodes named in one table cell; the reasons name every one


@dataclass(frozen=True)
class Drift:
    """One fact on which the nodes of one command disagree."""

    command: str
    key: str
    kind: str
    usual: str
    usual_nodes: int
    others: Mapping[str, list[str]]  # value -> nodes with it


def find_drift(command: str, group: Mapping[str, NodeReport]) -> list[Drift]:
    values: dict[str, dict[str, str]] = {}
    kinds: dict[str, str] = {}
    for node, report in group.items():
        for key, fact in report.facts.items():
            values.setdefault(key, {})[node] = fact.value
            kinds.setdefault(key, fact.kind)
    drifts = []
    for key, by_node in sorted(values.items()):
        counts = Counter(by_node.values())
        if len(counts) < 2:
            continue
        # The most common value; a tie goes to the smallest value, so the choice is stable.
        usual = min(counts, key=lambda v: (-counts[v], v))
        others: dict[str, list[str]] = {}
        for node, value in sorted(by_node.items()):
            if value != usual:
                others.setdefault(value, []).append(node)
        drifts.append(Drift(command, key, kinds[key], usual, counts[usual],
                            dict(sorted(others.items()))))
    return drifts


def drift_row(drift: Drift) -> dict[str, Any]:
    cells = []
    for value, nodes in drift.others.items():
        shown = ", ".join(nodes[:SHOWN_NODES])
        rest = f" and {len(nodes) - SHOWN_NODES} more" if len(nodes) > SHOWN_NODES else ""
        cells.append(f"{value} on {len(nodes)}: {shown}{rest}")
    return {"command": drift.command, "fact": drift.key, "kind": drift.kind,
            "most_nodes": drift.usual, "nodes": drift.usual_nodes, "differ": "; ".join(cells)}


def drift_reasons(drift: Drift) -> list[Reason]:
    reasons = []
    for value, nodes in drift.others.items():
        missing_gpus = drift.kind == HARDWARE and "count" in drift.key and _fewer(drift.usual,
                                                                                  value)
        for node in nodes:
            message = (f"{drift.key} is {value!r}; {drift.usual_nodes} other node(s) have "
                       f"{drift.usual!r}")
            if missing_gpus:
                reasons.append(Reason(node, "FAIL", "drain-node", "fleet.drift", message,
                                      drift.key, drift.command, "fewer GPUs than the other "
                                      "nodes: check nvidia-smi -L and the kernel log (Xid 79) "
                                      "before it takes jobs sized for a full node"))
            else:
                reasons.append(Reason(node, "WARN", "fix-config", "fleet.drift", message,
                                      drift.key, drift.command, "align this node with the "
                                      "others (driver, packages, container image, launcher "
                                      "environment), or confirm the difference is intended"))
    return reasons


def _fewer(usual: str, value: str) -> bool:
    want, have = gpu_count(usual), gpu_count(value)
    return want is not None and (have is None or have < want)
