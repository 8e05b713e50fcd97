"""What `gpucheck health --state-dir DIR` remembers between runs, so health recovers.

One JSON file, `DIR/health-state.json`, written atomically (temp file + rename:
a run killed mid-write leaves the previous state, never half a file). It holds:
- `boot_id` (/proc/sys/kernel/random/boot_id): a reboot resets what the kernel log
  and the InfiniBand counters mean, so remembered positions of another boot are
  dropped rather than compared;
- `kernel_log`: the fingerprint of the last Xid line already reported, so the next
  run raises only the lines after it (`gpucheck.health.xids`);
- `ib_ports`: each port's error counters and whether it was active, for the change
  since the last check (`gpucheck.health.ib_judge`);
- `gpus`: the most GPUs NVML has shown on this node, so one that falls off the bus is
  caught without --expect-gpus (`gpucheck.health.gpus`);
- `last`: the previous run's verdict, its time and its one-line summary.
A missing file is a first run; an unreadable one is reported and replaced.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.errors import UsageError
from gpucheck.output import write_atomic

STATE_FILE = "health-state.json"
STATE_VERSION = 1
BOOT_ID = "sys/kernel/random/boot_id"


def read_boot_id(proc: Path = Path("/proc")) -> str | None:
    """This boot's id (`cat /proc/sys/kernel/random/boot_id`); None where unreadable."""
    try:
        return (proc / BOOT_ID).read_text().strip() or None
    except OSError:
        return None


@dataclass
class HealthState:
    """The remembered state; `problem` says why a stored file could not be used."""

    boot_id: str | None = None
    kernel_log: dict[str, Any] = field(default_factory=dict)
    ib_ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    def same_boot(self, boot_id: str | None) -> bool:
        """True when the stored positions belong to this boot (unknown ids never match)."""
        return boot_id is not None and self.boot_id == boot_id

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "boot_id": self.boot_id,
                "kernel_log": self.kernel_log, "ib_ports": self.ib_ports, "gpus": self.gpus,
                "last": self.last}


def checked_state_dir(path: str | None) -> Path | None:
    """`--state-dir DIR`, created when missing; a UsageError (exit 2) when it cannot be."""
    if path is None:
        return None
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--state-dir {path} is not a directory: give a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--state-dir {path}: cannot create it ({exc.strerror}); "
                         "choose another directory") from None
    probe = directory / STATE_FILE
    if not _writable(directory) or (probe.exists() and not _writable(probe)):
        raise UsageError(f"--state-dir {path} is not writable by this user: choose another "
                         "directory or run as its owner")
    return directory


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def load_state(directory: Path | None) -> HealthState:
    """The stored state, an empty one on a first run (or without a state dir)."""
    if directory is None:
        return HealthState()
    path = directory / STATE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return HealthState()
    except (OSError, ValueError) as exc:
        return HealthState(problem=f"{path}: {getattr(exc, 'strerror', None) or exc}")
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != STATE_VERSION:
        return HealthState(problem=f"{path}: not a state file this gpucheck wrote "
                                   f"(version {version})")
    return HealthState(boot_id=raw.get("boot_id"), kernel_log=dict(raw.get("kernel_log") or {}),
                       ib_ports=dict(raw.get("ib_ports") or {}),
                       gpus=dict(raw.get("gpus") or {}), last=dict(raw.get("last") or {}))


def save_state(directory: Path, state: HealthState) -> str | None:
    """Write the state atomically; the reason when it could not be written, else None."""
    path = directory / STATE_FILE
    try:
        write_atomic(str(path), json.dumps(state.to_dict(), indent=1) + "\n")
    except UsageError as exc:  # write_atomic words it for --output: say it for the state
        reason = getattr(exc.__cause__, "strerror", None) or str(exc)
        return f"cannot write {path}: {reason}"
    return None
