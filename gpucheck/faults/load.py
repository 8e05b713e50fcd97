"""Rank 0's faults section for a load command (bench, comm, stress).

Each rank's `FaultWatch.result()` comes back with the gathered results, or, when
the run failed, only the reporting rank's own (published with its partial
results). A rank whose result is missing is said to be so (a SKIP naming it),
not silently left out; a rank is named by the GPU its check-in recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpucheck.devices import GpuIdentity
from gpucheck.faults.findings import faults_section
from gpucheck.report import Section

NOT_BACK = "its watch did not come back (the run ended before the ranks' results were gathered)"


def gpu_names(ranks: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Rank -> its physical GPU's label, from check-in rows (`RankInfo` as a dict:
    `device` "cuda:0 NVIDIA H200", `nvml_index`, `pci_bus_id`, `uuid`); CPU rows and
    rows without a bus id are left out, so the watcher's own label is used there."""
    names = {}
    for row in ranks:
        if not row.get("pci_bus_id"):
            continue
        name = str(row.get("device") or "").partition(" ")[2] or row.get("gpu_name")
        names[int(row["rank"])] = GpuIdentity(None, row.get("nvml_index"), name or None,
                                              row["pci_bus_id"], row.get("uuid")).label()
    return names


def _missing(rank: int) -> dict[str, Any]:
    return {"rank": rank, "status": "n/a", "reason": NOT_BACK}


def run_faults_section(results: Sequence[Mapping[str, Any] | None],
                       ranks: Iterable[int] = (),
                       names: Mapping[int, str] | None = None) -> Section:
    """The faults section from the results that came back; every rank in `ranks`
    without one gets an n/a result saying so."""
    back = [r for r in results if r is not None]
    seen = {r.get("rank") for r in back}
    back += [_missing(rank) for rank in sorted(set(ranks)) if rank not in seen]
    return faults_section(back, names)
