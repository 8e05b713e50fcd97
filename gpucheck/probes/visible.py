"""CUDA_VISIBLE_DEVICES read the way CUDA reads it.

CUDA walks the comma-separated entries in order and stops at the first one it
cannot use: something that is neither an index nor a UUID, an index past the last
GPU, a UUID (or UUID prefix) that matches no GPU or more than one, an entry already
listed, an empty entry. Everything after that entry is silently dropped, so
`CUDA_VISIBLE_DEVICES=0,1,,2,3` gives a job 2 GPUs, not 4. Under MIG, CUDA
enumerates only one MIG instance per process: `MIG-a,MIG-b` gives 1 device.
Equivalent by hand: `echo $CUDA_VISIBLE_DEVICES` next to `nvidia-smi -L`.

Pure functions on strings: no torch, no NVML (the NVML facts are passed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def _well_formed(entry: str) -> bool:
    return entry.startswith(("GPU-", "MIG-")) or entry.isdigit()


def parse_visible_devices(value: str | None) -> list[str] | None:
    """The entries CUDA can parse: None when unset; up to the first malformed entry.

    "-1" hides everything, "0,1,-1,2" exposes two GPUs. Existence of the GPUs is
    checked by `read_visible` when NVML's facts are known.
    """
    if value is None:
        return None
    entries = []
    for raw in value.split(","):
        entry = raw.strip()
        if not _well_formed(entry):
            break
        entries.append(entry)
    return entries


@dataclass(frozen=True)
class VisibleDevices:
    """What CUDA will make of CUDA_VISIBLE_DEVICES on this machine."""

    value: str | None
    used: list[str] = field(default_factory=list)  # the entries CUDA will honour
    cut_at: str | None = None  # the first entry CUDA stops at (None: all honoured)
    cut_reason: str | None = None
    cuda_count: int | None = None  # devices CUDA will enumerate (None: unknown)

    @property
    def is_set(self) -> bool:
        return self.value is not None


def _uuid_matches(entry: str, uuids: Sequence[str]) -> list[str]:
    # CUDA accepts any unique prefix of a GPU's UUID ("GPU-8c1e").
    return [u for u in uuids if u.startswith(entry)]


def _entry_problem(entry: str, nvml_count: int | None, uuids: Sequence[str] | None,
                   seen: set[str]) -> tuple[str | None, str | None]:
    """(why CUDA stops at this entry or None, the GPU it names)."""
    if entry == "":
        return "an empty entry", None
    if not _well_formed(entry):
        return "neither a GPU index nor a UUID", None
    name = entry
    if entry.isdigit() and nvml_count is not None and int(entry) >= nvml_count:
        return f"no GPU has index {entry} (this machine has {nvml_count})", None
    if entry.startswith("GPU-") and uuids:
        matches = _uuid_matches(entry, uuids)
        if len(matches) != 1:
            return ("no GPU has this UUID" if not matches
                    else f"the UUID prefix matches {len(matches)} GPUs"), None
        name = matches[0]
    if entry.isdigit() and uuids and int(entry) < len(uuids):
        name = uuids[int(entry)]
    if name in seen:
        return "a GPU listed twice", None
    return None, name


def read_visible(value: str | None, nvml_count: int | None,
                 uuids: Sequence[str] | None = None) -> VisibleDevices:
    """Walk the entries as CUDA does; `uuids` are NVML's GPU UUIDs in index order."""
    if value is None:
        return VisibleDevices(None, cuda_count=nvml_count)
    used: list[str] = []
    seen: set[str] = set()
    for raw in value.split(","):
        entry = raw.strip()
        reason, name = _entry_problem(entry, nvml_count, uuids, seen)
        if reason is not None:
            return VisibleDevices(value, used, entry, reason, _cuda_count(used))
        used.append(entry)
        seen.add(name or entry)
    return VisibleDevices(value, used, cuda_count=_cuda_count(used))


def _cuda_count(used: list[str]) -> int:
    """Devices CUDA enumerates from the honoured entries (one MIG instance at most)."""
    if any(e.startswith("MIG-") for e in used):
        return 1
    return len(used)


def expected_visible(nvml_count: int | None, cvd: str | None,
                     uuids: Sequence[str] | None = None) -> int | None:
    """How many GPUs CUDA should expose given NVML's count and CUDA_VISIBLE_DEVICES."""
    return read_visible(cvd, nvml_count, uuids).cuda_count
