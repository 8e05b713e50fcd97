"""How InfiniBand/RoCE ports are judged: down, slow, flapping (docs/health.md).

- `ib.port.state`: ACTIVE is OK. A port whose physical state is Disabled was turned
  off on purpose (`ibportstate ... disable`, the switch, or the firmware) and is OK:
  an unused port is expected to be disabled. A port that is down (or stuck in INIT/
  ARMED: no subnet manager configured it) is a FAIL when this node has seen it active
  before (the state dir remembers it, across runs and reboots, until it is active
  again), else a WARN: an unused, never-cabled port reads the same as a broken one.
- `ib.port.rate`: an active port slower than the fastest active port of the same
  link layer and HCA model on this node trained down (a cable, transceiver or switch
  port); a WARN, as for a narrow PCIe link.
- `ib.port.link_downed`: the port's `link_downed` counter (the IB PortCounters
  LinkDownedCounter: times the link went down and retrained) grew since the last
  check: the link flapped, and every NCCL job over it at that moment failed. A
  counter lower than last time was reset (a reboot, a driver reload, `perfquery -R`):
  no verdict then.
- `ib.ports`: SKIP on a node with no InfiniBand/RoCE device; with --expect-ib-ports N,
  FAIL when fewer than N ports are active.
Other counters (symbol errors, receive errors, ...) are shown with their change, not
judged: no source gives a rate that separates a sick link from a healthy one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck import subject as subjects
from gpucheck.health.ib import COUNTERS, PHYS_DISABLED, IbPort
from gpucheck.report import Finding, Section, fail, ok, skip, warn

TITLE = "InfiniBand / RoCE ports"
_LOOK = "ibstat; cat /sys/class/infiniband/{hca}/ports/{port}/{{state,phys_state,rate}}"


@dataclass(frozen=True)
class IbOptions:
    expect_active: int | None = None  # --expect-ib-ports
    ignore: tuple[str, ...] = ()  # --ib-ignore globs on "mlx5_0" or "mlx5_0/1"


@dataclass
class IbJudgement:
    section: Section
    remembered: dict[str, dict[str, Any]] = field(default_factory=dict)


def ignored(port: IbPort | str, patterns: Sequence[str]) -> bool:
    """`port` or its key "mlx5_0/1" matches a --ib-ignore pattern (the key or the HCA)."""
    key = port if isinstance(port, str) else port.key
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(key.rsplit("/", 1)[0], p)
               for p in patterns)


def missing_findings(ports: Sequence[IbPort], previous: dict[str, dict[str, Any]],
                     patterns: Sequence[str]) -> list[Finding]:
    """A port seen active at an earlier check that sysfs no longer shows: its HCA fell
    off the bus or its driver did not load. A FAIL until it is back (or ignored)."""
    present = {p.key for p in ports}
    gone = [k for k, v in sorted(previous.items()) if k not in present
            and v.get("seen_active") and not ignored(k, patterns)]
    return [fail("ib.port.state", "missing: active at an earlier check, no longer in "
                 "/sys/class/infiniband (the HCA fell off the bus or its driver did not load)",
                 "check lspci | grep -i mellanox, dmesg | grep mlx5 and the driver (mlx5_ib); "
                 f"if the HCA was removed on purpose, pass --ib-ignore {key}",
                 subjects.port(key, key.replace("/", " port ", 1))) for key in gone]


def _look(port: IbPort) -> str:
    return _LOOK.format(hca=port.hca, port=port.port)


def state_finding(port: IbPort, seen_active: bool) -> Finding:
    check, subject = "ib.port.state", port.subject
    state = f"state {port.state}: {port.state_name}, physical {port.phys_state}: {port.phys_name}"
    if port.active:
        return ok(check, f"active, {port.rate or 'rate n/a'} ({port.link_layer or 'n/a'})",
                  subject)
    if port.phys_state == PHYS_DISABLED:
        return ok(check, f"disabled by an administrator ({state}): not judged", subject)
    if port.state is None:
        return skip(check, "port state: n/a (sysfs gave no state)", subject)
    if seen_active:
        return fail(check, f"down: was active at an earlier check, now {state}",
                    "check the cable, transceiver and switch port; " + _look(port), subject)
    return warn(check, f"not active ({state}), and never seen active on this node: an unused "
                "port reads the same as a broken one",
                "if the port is unused, disable it (it then reads Disabled and is not judged) "
                "or pass --ib-ignore " + port.key + "; else check its cable and the subnet "
                "manager: " + _look(port), subject)


def rate_finding(port: IbPort, fastest: float | None) -> Finding | None:
    if not port.active or port.rate_gbps is None or fastest is None:
        return None
    if port.rate_gbps < fastest:
        return warn("ib.port.rate", f"runs at {port.rate}, slower than the node's fastest "
                    f"{port.link_layer or ''} port of the same HCA model ({fastest:g} Gb/sec)",
                    "a cable, transceiver or switch port trained down: reseat or replace it; "
                    + _look(port), port.subject)
    return ok("ib.port.rate", f"{port.rate}, as fast as the node's fastest port of its kind",
              port.subject)


def counter_deltas(port: IbPort, before: dict[str, Any] | None) -> dict[str, int] | None:
    """Each counter's change since the last check; None without a comparable count
    (no earlier check, or a counter went down: reset since)."""
    old = (before or {}).get("counters")
    if not isinstance(old, dict):
        return None
    shared = [n for n in COUNTERS if n in port.counters and isinstance(old.get(n), int)]
    if not shared or any(port.counters[n] < old[n] for n in shared):
        return None
    return {n: port.counters[n] - old[n] for n in shared}


def flap_finding(port: IbPort, deltas: dict[str, int] | None,
                 before: dict[str, Any] | None) -> Finding | None:
    check = "ib.port.link_downed"
    if deltas is None or "link_downed" not in deltas:
        return None
    since = f"since the last check ({(before or {}).get('at') or 'time n/a'})"
    others = ", ".join(f"{n} +{d}" for n, d in deltas.items() if d and n != "link_downed")
    detail = f"; {others}" if others else ""
    if deltas["link_downed"]:
        return warn(check, f"the link went down {deltas['link_downed']} time(s) {since} and "
                    f"retrained: flapping{detail}", "take the node out until the cable, "
                    "transceiver or switch port is checked; " + _look(port), port.subject)
    return ok(check, f"no link-down {since}{detail}", port.subject)


def _fastest(ports: Sequence[IbPort]) -> dict[tuple[str | None, str | None], float]:
    fastest: dict[tuple[str | None, str | None], float] = {}
    for port in ports:
        if port.active and port.rate_gbps is not None:
            fastest[port.kind] = max(fastest.get(port.kind, 0.0), port.rate_gbps)
    return fastest


def _count_finding(judged: Sequence[IbPort], options: IbOptions) -> Finding:
    active = [p for p in judged if p.active]
    said = f"{len(active)} of {len(judged)} port(s) active"
    if options.expect_active is None:
        return ok("ib.ports", said)
    if len(active) < options.expect_active:
        down = ", ".join(p.subject for p in judged if not p.active) or "none found"
        return fail("ib.ports", f"{said}, {options.expect_active} expected (not active: "
                    f"{down})", "check the cables, transceivers and the subnet manager (ibstat)")
    return ok("ib.ports", f"{said} ({options.expect_active} expected)")


def judge_ports(ports: list[IbPort] | None, previous: dict[str, dict[str, Any]],
                options: IbOptions, now: str) -> IbJudgement:
    """The section, and what to remember for the next check (each port's counters and
    whether it was ever seen active)."""
    if not ports and not missing_findings([], previous, options.ignore):
        where = "no /sys/class/infiniband" if ports is None else "no device in it"
        finding = (fail("ib.ports", f"no InfiniBand/RoCE port ({where}), "
                        f"{options.expect_active} expected active", "load the RDMA driver "
                        "(mlx5_ib) and check the HCAs: ibstat, lspci | grep -i mellanox")
                   if options.expect_active else
                   skip("ib.ports", f"no InfiniBand/RoCE device on this node ({where})"))
        return IbJudgement(Section("ib", TITLE, {"ports": []}, [finding]), dict(previous))
    ports = ports or []
    judged = [p for p in ports if not ignored(p, options.ignore)]
    fastest = _fastest(judged)
    findings: list[Finding] = [_count_finding(judged, options)]
    rows, remembered = [], dict(previous)
    for port in judged:
        before = previous.get(port.key)
        seen_active = port.active or bool((before or {}).get("seen_active"))
        deltas = counter_deltas(port, before)
        found = [state_finding(port, seen_active), rate_finding(port, fastest.get(port.kind)),
                 flap_finding(port, deltas, before)]
        findings.extend(f for f in found if f is not None)
        rows.append({**port.row(), "change_since_last_check": deltas})
        remembered[port.key] = {"seen_active": seen_active, "counters": port.counters,
                                "at": now}
    findings += missing_findings(ports, previous, options.ignore)
    data = {"ports": rows, "ignored": [p.key for p in ports if ignored(p, options.ignore)]}
    return IbJudgement(Section("ib", TITLE, data, findings), remembered)
