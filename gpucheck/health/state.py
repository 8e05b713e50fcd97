"""What `gpucheck health --state-dir DIR` remembers between runs, so health recovers.

One JSON file, `DIR/health-state.json`. Shared by every consumer of the node:
- `ib_ports`: each InfiniBand port any check saw active (`gpucheck.health.ib_judge`): a
  port is the node's, so the prolog and the health check judge it from one history;
- `gpus`: the most GPUs NVML has shown on this node (`gpucheck.health.gpus`);
- `faults`: the faults that stay reported until what clears them has happened
  (`gpucheck.health.faults`: a reboot, or `gpucheck health --set-healthy`);
- `baseline`: the kernel-log position `--set-healthy` cleared up to, where a consumer
  seen for the first time starts;
- `unread`: why a state before this one could not be read, and since when: the node
  is not known to be healthy until `--set-healthy` clears it.
Per consumer (`--consumer NAME`: the SLURM HealthCheckProgram, the prolog, the
Prometheus textfile job each read the log for themselves, so none consumes another's
Xid lines), under `consumers.NAME`:
- `boot_id` (/proc/sys/kernel/random/boot_id): a reboot resets what the kernel log
  and the InfiniBand counters mean, so positions of another boot are not compared;
- `kernel_log`: where this consumer stopped reading the Xid lines (`gpucheck.health.xids`);
- `ib_ports`: each port's error counters at this consumer's last check;
- `last`: the previous run's verdict, its time and its problems.

The state dir is trusted only when it is this user's and no one else may write it
(else a UsageError): gpucheck runs as root, and a file another user can replace or
link could make root overwrite another file, block, or fill memory. The file is read
without following a link, only if it is a regular file of this user, up to
MAX_STATE_BYTES; written as a temp file renamed into place (a link at the name is
replaced, never followed). A file that cannot be used (damaged, another user's, a
newer version) is set aside (`health-state.json.bad`) and a new file, marked `unread`,
replaces it; it may have held a fault that never clears by itself, so until an
administrator runs `--set-healthy` (which clears the mark and moves the file to
`health-state.json.bad.cleared`) the node is not known to be healthy: `health.state`
FAILs on every run, for every consumer.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.errors import UsageError
from gpucheck.health.schema import (
    MAX_CONSUMERS,
    MAX_FAULTS,
    MAX_PORTS,
    MAX_TEXT,
    STATE_VERSION,
    Damaged,
    checked_state,
)
from gpucheck.inputs import InputError, parse_json, read_capped

STATE_FILE = "health-state.json"
SET_ASIDE = STATE_FILE + ".bad"
CLEARED = SET_ASIDE + ".cleared"
BOOT_ID = "sys/kernel/random/boot_id"
MAX_STATE_BYTES = 1024**2  # a node's state is a few KiB: 1 MiB is a wrong file
DEFAULT_CONSUMER = "default"


def read_boot_id(proc: Path = Path("/proc")) -> str | None:
    """This boot's id (`cat /proc/sys/kernel/random/boot_id`); None where unreadable."""
    try:
        return (proc / BOOT_ID).read_text().strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        return None


@dataclass
class HealthState:
    """One consumer's view of the state: its own part, the shared part, and `unknown`
    saying why a stored file could not be read."""

    boot_id: str | None = None
    kernel_log: dict[str, Any] = field(default_factory=dict)
    ib_ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    ib_history: dict[str, dict[str, Any]] = field(default_factory=dict)  # the node's
    last: dict[str, Any] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    unknown: str | None = None  # why a state could not be read (until --set-healthy)
    cleared: list[str] = field(default_factory=list)  # faults this run saw cleared

    def same_boot(self, boot_id: str | None) -> bool:
        """True when the stored positions belong to this boot (unknown ids never match)."""
        return boot_id is not None and self.boot_id == boot_id

    def own(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "kernel_log": self.kernel_log,
                "ib_ports": self.ib_ports, "last": self.last}


def _trust_problem(info: os.stat_result, what: str) -> str | None:
    """Why a state dir or file another user could change is not used, or None."""
    if info.st_uid != os.geteuid():
        return f"{what} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} may be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def checked_state_dir(path: str | None) -> Path | None:
    """`--state-dir DIR`, created (0755) when missing; a UsageError (exit 2) when it cannot
    be, or when it is not this user's alone to write."""
    if path is None:
        return None
    directory = Path(path)
    _refuse_others_link(directory, path)
    problem = _parents_problem(directory)
    if problem is not None:
        raise UsageError(f"--state-dir {path}: {problem}: another user could move it away and "
                         "put their own in its place; give a directory under ones only root "
                         "or this user may change (e.g. /var/lib/gpucheck)")
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--state-dir {path} is not a directory: give a directory")
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        info = os.stat(directory)
    except OSError as exc:
        raise UsageError(f"--state-dir {path}: cannot create it ({exc.strerror}); "
                         "choose another directory") from None
    problem = _trust_problem(info, "it")
    if problem is not None:
        raise UsageError(f"--state-dir {path}: {problem}: give a directory only this user "
                         "may write (chown it, chmod go-w), never a shared one like /tmp")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--state-dir {path} is not writable by this user: choose another "
                         "directory or run as its owner")
    return directory


def _parents_problem(directory: Path) -> str | None:
    """Why a directory above the state dir lets another user replace it (theirs, or
    writable by others and not sticky), or None. Those not made yet are made by this
    user (0755)."""
    for parent in Path(os.path.realpath(directory)).parents:
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{parent} cannot be looked at ({exc.strerror})"
        if info.st_uid not in (0, os.geteuid()):
            return f"{parent} belongs to uid {info.st_uid}"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return f"{parent} may be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _refuse_others_link(directory: Path, path: str) -> None:
    """A state dir given as a symbolic link that another user made (in /tmp, say) is
    refused: it would point root's writes at any directory root owns."""
    try:
        info = os.lstat(directory)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode) and info.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"--state-dir {path} is a symbolic link made by uid {info.st_uid}, "
                         "not by this user: give a directory only this user may write")


def read_raw(directory: Path) -> dict[str, Any] | None:
    """The stored state as checked data; None when there is none. Damaged when it
    cannot be used (a link, a FIFO, too big, another user's, not what gpucheck wrote)."""
    path = directory / STATE_FILE
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Damaged(exc.strerror or str(exc)) from None
    if stat.S_ISLNK(info.st_mode):
        raise Damaged("it is a symbolic link; gpucheck never follows one here")
    try:
        data = read_capped(str(path), MAX_STATE_BYTES, follow=False)
        problem = _trust_problem(os.stat(path, follow_symlinks=False), "it")
        if problem is not None:
            raise Damaged(problem)
        raw = parse_json(data)
    except InputError as exc:
        raise Damaged(f"it {exc.strerror}") from None
    except OSError as exc:
        raise Damaged(exc.strerror or str(exc)) from None
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, JsonProblem
        raise Damaged(f"not JSON ({str(exc)[:80]})") from None
    return checked_state(raw)


def load_state(directory: Path | None, consumer: str = DEFAULT_CONSUMER) -> HealthState:
    """`consumer`'s view of the stored state; an empty one on a first run or without a
    state dir. `unknown` says why the node is not known to be healthy: this file could
    not be read (it is set aside), or one before it could not and no administrator has
    cleared it yet (the file's `unread`)."""
    if directory is None:
        return HealthState()
    try:
        raw = read_raw(directory)
    except Damaged as exc:
        return HealthState(unknown=f"{directory / STATE_FILE}: {exc}{_set_aside(directory)}")
    if raw is None:  # set aside by a run that could not write a new one since
        return HealthState(unknown=f"{directory / SET_ASIDE} was set aside, and no state "
                           "written since" if _exists(directory / SET_ASIDE) else None)
    own = raw["consumers"].get(consumer, {})
    return HealthState(boot_id=own.get("boot_id"), kernel_log=own.get("kernel_log", {}),
                       ib_ports=own.get("ib_ports", {}), ib_history=raw["ib_ports"],
                       last=own.get("last", {}),
                       gpus=raw["gpus"], faults=raw["faults"], baseline=raw["baseline"],
                       unknown=raw["unread"].get("why"))


def _exists(path: Path) -> bool:
    """Whether anything is at `path` (a link is not followed)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there but not readable: not known to be gone
    return True


def _set_aside(directory: Path) -> str:
    """Rename the unusable file (a link is renamed, not followed) so a person can look."""
    try:
        os.replace(directory / STATE_FILE, directory / SET_ASIDE)
    except OSError as exc:
        return f" (could not set it aside: {exc.strerror})"
    return f"; set aside as {SET_ASIDE}"


def clear_set_aside(directory: Path) -> str | None:
    """`--set-healthy`: an administrator looked at the set-aside file; keep it as
    CLEARED (the last one cleared) so it no longer holds the node. The reason when it
    could not be moved, else None."""
    if not _exists(directory / SET_ASIDE):
        return None
    try:
        os.replace(directory / SET_ASIDE, directory / CLEARED)
    except OSError as exc:
        return f"cannot move {directory / SET_ASIDE} aside: {exc.strerror}"
    return None


def merged(directory: Path, consumer: str, new: HealthState, added: list[dict[str, Any]],
           cleared: set[str]) -> dict[str, Any]:
    """The file to write: this consumer's part, every other consumer's part and the
    faults as the file holds them now (read again just before writing, so that a run
    beside this one, or a `--set-healthy`, is kept: at worst a duplicate, never a
    loss), less the faults this run saw cleared, plus those it added."""
    try:
        now = read_raw(directory)
    except Damaged:
        now = None
    if now is None:  # gone or damaged since: what this run read is the best there is
        now = {"consumers": {}, "faults": new.faults, "baseline": new.baseline, "gpus": {},
               "ib_ports": {}, "unread": {}}
    keys = {f["key"] for f in now["faults"]}
    faults = [f for f in now["faults"] if f["key"] not in cleared]
    faults += [f for f in added if f["key"] not in keys]
    most = [v for v in (now["gpus"].get("most_seen"), new.gpus.get("most_seen"))
            if isinstance(v, int)]
    return {"version": STATE_VERSION, "gpus": {"most_seen": max(most) if most else None},
            "faults": faults[-MAX_FAULTS:], "baseline": now["baseline"],
            "ib_ports": dict(list({**now["ib_ports"], **new.ib_history}.items())[-MAX_PORTS:]),
            "unread": now["unread"] or ({"why": new.unknown[:MAX_TEXT],
                                         "since": str(new.last.get("at"))}
                                        if new.unknown else {}),
            "consumers": _kept(now["consumers"], consumer, new.own())}


def _kept(consumers: dict[str, Any], name: str, own: dict[str, Any]) -> dict[str, Any]:
    """Every consumer's part with this one's replaced; beyond MAX_CONSUMERS, those that
    ran longest ago are dropped (a file the reader would refuse helps no one)."""
    others = sorted(((k, v) for k, v in consumers.items() if k != name),
                    key=lambda item: str(item[1].get("last", {}).get("at") or ""))
    return {**dict(others[max(0, len(others) - MAX_CONSUMERS + 1):]), name: own}


def write_state(directory: Path, data: dict[str, Any]) -> str | None:
    """Write `data` as the state file: a temp file in the dir (O_EXCL, never a link),
    fsync, rename over the name (a link there is replaced, not followed). The reason
    when it could not be written, else None."""
    import json

    path = directory / STATE_FILE
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror}"
    replaced = False
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(json.dumps(data, indent=1) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        replaced = True
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    finally:  # a failure, or a stop signal (SIGTERM raises) mid-write: no temp file left
        if not replaced:
            Path(tmp).unlink(missing_ok=True)
    return None
