"""InfiniBand and RoCE ports: read from sysfs (`/sys/class/infiniband/<hca>/ports/<n>/`,
as `ibstat` shows them) and judged: down, slow, flapping (docs/health.md argues each
rule; the file formats are the kernel's, drivers/infiniband/core/sysfs.c).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck import subject as subjects
from gpucheck.report import Finding, Section, fail, ok, skip, warn

ACTIVE_STATES = (4, 5)  # ACTIVE, ACTIVE_DEFER
PHYS_DISABLED = 3
# The counters read (each a file under counters/); absent ones are left out.
COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery",
            "port_rcv_remote_physical_errors", "local_link_integrity_errors",
            "excessive_buffer_overrun_errors", "port_xmit_discards")
_NUMBERED = re.compile(r"\s*(\d+)\s*:\s*(.*)")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")


@dataclass(frozen=True)
class IbPort:
    """One port as sysfs shows it; None where a file is absent or unreadable."""

    hca: str
    port: int
    state: int | None = None
    state_name: str | None = None
    phys_state: int | None = None
    phys_name: str | None = None
    rate_gbps: float | None = None
    rate: str | None = None
    link_layer: str | None = None
    hca_type: str | None = None
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """"mlx5_0/1": the port's name in --ib-ignore and in the state file."""
        return f"{self.hca}/{self.port}"

    @property
    def subject(self) -> subjects.Subject:
        """"mlx5_0 port 1"; its `port` field is the key (the prometheus renderer reads it)."""
        return subjects.port(self.key, f"{self.hca} port {self.port}")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def kind(self) -> tuple[str | None, str | None]:
        """Ports compared for speed: the same link layer and HCA model."""
        return self.link_layer, self.hca_type

    def row(self) -> dict[str, object]:
        return {"port": self.subject.label, "link_layer": self.link_layer,
                "state": _label(self.state, self.state_name),
                "phys_state": _label(self.phys_state, self.phys_name), "rate": self.rate,
                **{name: self.counters.get(name) for name in COUNTERS}}


def _label(number: int | None, name: str | None) -> str | None:
    return None if number is None else f"{number}: {name}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _numbered(text: str | None) -> tuple[int | None, str | None]:
    match = _NUMBERED.fullmatch(text or "")
    return (None, None) if match is None else (int(match[1]), match[2].strip())


def read_port(hca_dir: Path, port_dir: Path) -> IbPort:
    """`cat state phys_state rate link_layer counters/*` of one port."""
    state, state_name = _numbered(_read(port_dir / "state"))
    phys, phys_name = _numbered(_read(port_dir / "phys_state"))
    rate = _read(port_dir / "rate")
    match = _RATE.match(rate or "")
    counters = {name: _read(port_dir / "counters" / name) for name in COUNTERS}
    # The HCA's name: bytes not UTF-8 as `\\xff` (no lone surrogates in reports).
    return IbPort(os.fsencode(hca_dir.name).decode("utf-8", "backslashreplace"),
                  int(port_dir.name), state, state_name, phys, phys_name,
                  float(match[1]) if match else None, rate, _read(port_dir / "link_layer"),
                  _read(hca_dir / "hca_type"),
                  {k: int(v) for k, v in counters.items() if v is not None and v.isdigit()})


def read_ports(sysfs: Path = Path("/sys")) -> list[IbPort] | None:
    """Every port of every HCA, sorted; None without an InfiniBand class (no RDMA
    driver), [] with the class but no device."""
    root = sysfs / "class/infiniband"
    if not root.is_dir():
        return None
    ports = []
    for hca_dir in sorted(root.iterdir()):
        ports_dir = hca_dir / "ports"
        if not ports_dir.is_dir():
            continue
        for port_dir in sorted(ports_dir.iterdir(), key=lambda p: p.name):
            if port_dir.name.isdigit():
                ports.append(read_port(hca_dir, port_dir))
    return ports


# --- judging ------------------------------------------------------------

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
    """FAIL for each port seen active before that sysfs no longer shows."""
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
    """Each counter's change since the last check; None without one, or after a reset."""
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


def _count_finding(judged: Sequence[IbPort], options: IbOptions) -> Finding:
    active = [p for p in judged if p.active]
    said = f"{len(active)} of {len(judged)} port(s) active"
    if options.expect_active is None:
        return ok("ib.ports", said)
    if len(active) < options.expect_active:
        down = ", ".join(p.subject.label for p in judged if not p.active) or "none found"
        return fail("ib.ports", f"{said}, {options.expect_active} expected (not active: "
                    f"{down})", "check the cables, transceivers and the subnet manager (ibstat)")
    return ok("ib.ports", f"{said} ({options.expect_active} expected)")


def judge_ports(ports: list[IbPort] | None, previous: dict[str, dict[str, Any]],
                options: IbOptions, now: str) -> IbJudgement:
    """The section, and what to remember (counters, ever seen active) for the next."""
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
    fastest: dict[tuple[str | None, str | None], float] = {}
    for port in judged:
        if port.active and port.rate_gbps is not None:
            fastest[port.kind] = max(fastest.get(port.kind, 0.0), port.rate_gbps)
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
