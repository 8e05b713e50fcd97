"""The health state file's shape, checked field by field before anything uses it.

A state file is data another run (or a person, or a disk error) may have damaged:
`{"version": 1, "last": {"problems": 5}}` once gave a traceback on every run. So every
field is checked for its type and size here, and a file that does not fit is
`Damaged` (the caller sets the file aside, writes a new one, and FAILs `health.state`
until an administrator clears it: gpucheck.health.state). Only version 2 is read
(STATE_VERSION): a file of another version, a newer one included, is set aside the same
way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gpucheck.actions import ACTIONS
from gpucheck.checks import lookup
from gpucheck.subject import Subject

STATE_VERSION = 2  # what gpucheck.health.state writes; no other version is read
MAX_CONSUMERS = 32
MAX_FAULTS = 256
MAX_PORTS = 1024
MAX_PROBLEMS = 4096
MAX_TAIL = 64
MAX_TEXT = 4096
CONSUMER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Damaged(ValueError):
    """The state file cannot be used; the message says why, in a few words."""


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise Damaged(f"{where} is not {what}")


# The readers below test with isinstance in an `if` (not through _need) so that the
# type checker knows what they return.
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
    """`kernel_log`: {count, chain, tail, source}."""
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


def _last(value: Any, where: str) -> dict[str, Any]:
    raw = _dict(value if value is not None else {}, where)
    _text(raw.get("verdict"), f"{where}.verdict")
    _text(raw.get("at"), f"{where}.at")
    _texts(raw.get("problems", []), f"{where}.problems", MAX_PROBLEMS)
    return raw


def consumer_part(value: Any, where: str) -> dict[str, Any]:
    raw = _dict(value, where)
    ports = _dict(raw.get("ib_ports") or {}, f"{where}.ib_ports", MAX_PORTS)
    return {"boot_id": _text(raw.get("boot_id"), f"{where}.boot_id"),
            "kernel_log": cursor(raw.get("kernel_log"), f"{where}.kernel_log"),
            "ib_ports": {_str(k, f"{where}.ib_ports key"): _port(v, f"{where}.ib_ports")
                         for k, v in ports.items()},
            "last": _last(raw.get("last"), f"{where}.last")}


def fault(value: Any, where: str) -> dict[str, Any]:
    """One fault still reported (gpucheck.health.faults): every field a short string."""
    raw = _dict(value, where)
    for key in ("key", "check", "status", "action", "message", "since"):
        _str(raw.get(key), f"{where}.{key}")
    for key in ("subject", "hint", "boot_id"):
        _text(raw.get(key), f"{where}.{key}")
    if raw.get("subject_fields") is not None:
        raw["subject_fields"] = _subject(raw["subject_fields"], f"{where}.subject_fields")
    _need(raw["status"] in ("WARN", "FAIL"), f"{where}.status", "WARN or FAIL")
    _need(raw["action"] in ACTIONS, f"{where}.action", "a gpucheck action")
    _need(_declared(raw["check"]), f"{where}.check", "a check id this gpucheck declares")
    return raw


def _subject(value: Any, where: str) -> dict[str, Any]:
    """A subject as `Subject.to_dict` wrote it: short strings and numbers only, read
    back whole by `Subject.from_dict` (TypeError or ValueError: damaged)."""
    raw = _dict(value, where, most=16)
    for key, field in raw.items():
        _need(not isinstance(field, str) or len(field) <= MAX_TEXT, f"{where}.{key}",
              "a short string")
    try:
        Subject.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise Damaged(f"{where} is not a subject ({str(exc)[:80]})") from None
    return raw


def _declared(check: str) -> bool:
    """Whether `check` is declared (gpucheck.checks): a fault is raised again as a
    finding, and a finding of an undeclared id cannot be made."""
    try:
        lookup(check)
    except KeyError:
        return False
    return True


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
    """`ib_ports`, the node's: each port any check saw active, whichever consumer ran it
    (a port is the node's, so one consumer's view must not disagree with another's).
    A file written before this was kept per consumer is read the same way."""
    raw = _dict(value or {}, "ib_ports", MAX_PORTS)
    seen = {_str(k, "ib_ports key"): _port(v, f"ib_ports.{k:.40}") for k, v in raw.items()}
    for part in consumers:
        for key, port in part["ib_ports"].items():
            seen.setdefault(key, {"seen_active": False})
            seen[key] = {"seen_active": bool(seen[key].get("seen_active") or
                                             port.get("seen_active"))}
    return {k: {"seen_active": True} for k, v in seen.items() if v.get("seen_active")}
