"""What `gpucheck health --state-dir DIR` remembers between runs, read only from a
directory and file of this user's alone, every field checked (docs/health.md, "State").
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.checks import ACTIONS, lookup
from gpucheck.errors import UsageError
from gpucheck.inputs import InputError, parse_json, read_capped
from gpucheck.output import unsafe_chain, write_atomic
from gpucheck.subject import Subject

STATE_VERSION = 2  # what this module writes; no other version is read
MAX_CONSUMERS = 32
MAX_FAULTS = 256
MAX_PORTS = 1024
MAX_PROBLEMS = 4096
MAX_TAIL = 64
MAX_TEXT = 4096
CONSUMER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Damaged(ValueError):
    """The state file cannot be used; the message says why."""


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise Damaged(f"{where} is not {what}")


# The readers test isinstance in an `if` (not through _need): the type checker sees it.
def _dict(value: Any, where: str, most: int = 64) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > most:
        raise Damaged(f"{where} is not an object (<= {most} keys)")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise Damaged(f"{where} is not a short string")
    return value


def _text(value: Any, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Damaged(f"{where} is not a whole number")
    return value


def _texts(value: Any, where: str, most: int) -> list[str]:
    _need(isinstance(value, list) and len(value) <= most, where, f"a list (<= {most} items)")
    return [_str(v, f"{where}[]") for v in value]


def cursor(value: Any, where: str) -> dict[str, Any]:
    raw = _dict(value if value is not None else {}, where)
    out: dict[str, Any] = {"source": _text(raw.get("source"), f"{where}.source")}
    out["tail"] = _texts(raw.get("tail", []), f"{where}.tail", MAX_TAIL)
    out["count"] = _int(raw.get("count"), f"{where}.count")
    out["chain"] = _text(raw.get("chain"), f"{where}.chain")
    return out


def _port(value: Any, where: str) -> dict[str, Any]:
    raw = _dict(value, where)
    _need(isinstance(raw.get("seen_active", False), bool), f"{where}.seen_active", "true/false")
    counters = _dict(raw.get("counters", {}), f"{where}.counters")
    for name, count in counters.items():
        _int(count, f"{where}.counters.{name}")
    _text(raw.get("at"), f"{where}.at")
    return raw


def consumer_part(value: Any, where: str) -> dict[str, Any]:
    raw = _dict(value, where)
    ports = _dict(raw.get("ib_ports") or {}, f"{where}.ib_ports", MAX_PORTS)
    last = _dict(raw.get("last") if raw.get("last") is not None else {}, f"{where}.last")
    for key in ("verdict", "at"):
        _text(last.get(key), f"{where}.last.{key}")
    _texts(last.get("problems", []), f"{where}.last.problems", MAX_PROBLEMS)
    return {"boot_id": _text(raw.get("boot_id"), f"{where}.boot_id"),
            "kernel_log": cursor(raw.get("kernel_log"), f"{where}.kernel_log"),
            "ib_ports": {_str(k, f"{where}.ib_ports key"): _port(v, f"{where}.ib_ports")
                         for k, v in ports.items()}, "last": last}


def fault(value: Any, where: str) -> dict[str, Any]:
    """One fault still reported: every field a short string."""
    raw = _dict(value, where)
    for key in ("key", "check", "status", "action", "message", "since"):
        _str(raw.get(key), f"{where}.{key}")
    for key in ("subject", "hint", "boot_id"):
        _text(raw.get(key), f"{where}.{key}")
    if raw.get("subject_fields") is not None:
        raw["subject_fields"] = _subject(raw["subject_fields"], f"{where}.subject_fields")
    _need(raw["status"] in ("WARN", "FAIL"), f"{where}.status", "WARN or FAIL")
    _need(raw["action"] in ACTIONS, f"{where}.action", "a gpucheck action")
    try:  # it is raised again as a finding: its check id must be declared
        lookup(raw["check"])
    except KeyError:
        raise Damaged(f"{where}.check is not a check id this gpucheck declares") from None
    return raw


def _subject(value: Any, where: str) -> dict[str, Any]:
    """A subject as `Subject.to_dict` wrote it, read back whole by `Subject.from_dict`."""
    raw = _dict(value, where, most=16)
    for key, item in raw.items():
        _need(not isinstance(item, str) or len(item) <= MAX_TEXT, f"{where}.{key}",
              "a short string")
    try:
        Subject.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise Damaged(f"{where} is not a subject ({str(exc)[:80]})") from None
    return raw


def checked_state(raw: Any) -> dict[str, Any]:
    """The file's data, every field checked; Damaged otherwise (another version too)."""
    top = _dict(raw, "the file")
    version = top.get("version")
    _need(type(version) is int and version == STATE_VERSION, f"its version ({version!r:.20})",
          f"the one this gpucheck writes ({STATE_VERSION})")
    gpus = _dict(top.get("gpus") or {}, "gpus")
    out: dict[str, Any] = {"gpus": {"most_seen": _int(gpus.get("most_seen"), "gpus.most_seen")}}
    consumers = _dict(top.get("consumers") or {}, "consumers", MAX_CONSUMERS)
    faults = top.get("faults") or []
    _need(isinstance(faults, list) and len(faults) <= MAX_FAULTS, "faults", "a short list")
    baseline = _dict(top.get("baseline") or {}, "baseline")
    out["faults"] = [fault(f, "faults[]") for f in faults]
    out["baseline"] = ({"boot_id": _text(baseline.get("boot_id"), "baseline.boot_id"),
                        "kernel_log": cursor(baseline.get("kernel_log"), "baseline.kernel_log")}
                       if baseline else {})
    out["consumers"] = {}
    for name, part in consumers.items():
        _need(isinstance(name, str) and CONSUMER.fullmatch(name) is not None,
              "a consumer's name", "a short name")
        out["consumers"][name] = consumer_part(part, f"consumers.{name}")
    out["ib_ports"] = ib_history(top.get("ib_ports"), out["consumers"].values())
    unread = _dict(top.get("unread") or {}, "unread")
    out["unread"] = {"why": _str(unread.get("why"), "unread.why"),
                     "since": _str(unread.get("since"), "unread.since")} if unread else {}
    return out


def ib_history(value: Any, consumers: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`ib_ports`, the node's: each port any consumer saw active (older files kept it
    per consumer: read the same way)."""
    raw = _dict(value or {}, "ib_ports", MAX_PORTS)
    seen = {_str(k, "ib_ports key"): _port(v, f"ib_ports.{k:.40}") for k, v in raw.items()}
    seen |= {key: port for part in consumers for key, port in part["ib_ports"].items()
             if port.get("seen_active")}
    return {k: {"seen_active": True} for k, v in seen.items() if v.get("seen_active")}


# --- the file: read, merged, written ------------------------------------------

STATE_FILE = "health-state.json"
SET_ASIDE = STATE_FILE + ".bad"
CLEARED = SET_ASIDE + ".cleared"
BOOT_ID = "sys/kernel/random/boot_id"
MAX_STATE_BYTES = 1024**2  # a node's state is a few KiB: 1 MiB is a wrong file
DEFAULT_CONSUMER = "default"


def read_boot_id(proc: Path = Path("/proc")) -> str | None:
    """`cat /proc/sys/kernel/random/boot_id`; None where unreadable."""
    try:
        return (proc / BOOT_ID).read_text().strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        return None


@dataclass
class HealthState:
    """One consumer's view: its own part, the shared part, and why a file was unread."""

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
        """The stored positions are this boot's (unknown ids never match)."""
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
    """`--state-dir DIR`, made (0755) when missing; UsageError unless this user's alone."""
    if path is None:
        return None
    directory = Path(path)
    problem = unsafe_chain(os.path.abspath(path)) or unsafe_chain(os.path.realpath(path))
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


def read_raw(directory: Path) -> dict[str, Any] | None:
    """The stored state, checked; None when there is none; Damaged when unusable."""
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
    """`consumer`'s view of the stored state (empty on a first run); `unknown` says why
    the node is not known to be healthy (a file set aside, now or before)."""
    if directory is None:
        return HealthState()
    try:
        raw = read_raw(directory)
    except Damaged as exc:
        try:  # renamed (a link is not followed) so a person can look
            os.replace(directory / STATE_FILE, directory / SET_ASIDE)
            aside = f"; set aside as {SET_ASIDE}"
        except OSError as error:
            aside = f" (could not set it aside: {error.strerror})"
        return HealthState(unknown=f"{directory / STATE_FILE}: {exc}{aside}")
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
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there but not readable: not known to be gone
    return True


def clear_set_aside(directory: Path) -> str | None:
    """`--set-healthy`: the set-aside file becomes CLEARED; why not, when it cannot."""
    if not _exists(directory / SET_ASIDE):
        return None
    try:
        os.replace(directory / SET_ASIDE, directory / CLEARED)
    except OSError as exc:
        return f"cannot move {directory / SET_ASIDE} aside: {exc.strerror}"
    return None


def merged(directory: Path, consumer: str, new: HealthState, added: list[dict[str, Any]],
           cleared: set[str]) -> dict[str, Any]:
    """The file to write: this consumer's part, the others' and the faults as the file
    holds them now (read again: a run beside this one is kept), less the faults this
    run saw cleared, plus those it added."""
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
    """Every consumer's part with this one's; beyond MAX_CONSUMERS the oldest go."""
    others = sorted(((k, v) for k, v in consumers.items() if k != name),
                    key=lambda item: str(item[1].get("last", {}).get("at") or ""))
    return {**dict(others[max(0, len(others) - MAX_CONSUMERS + 1):]), name: own}


def write_state(directory: Path, data: dict[str, Any]) -> str | None:
    """Write `data` as the state file (atomically, never through a link); why not."""
    try:
        write_atomic(str(directory / STATE_FILE), json.dumps(data, indent=1) + "\n",
                     option="--state-dir")
    except UsageError as exc:
        return str(exc)
    return None
