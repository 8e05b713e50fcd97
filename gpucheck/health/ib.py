"""InfiniBand and RoCE ports from sysfs (`/sys/class/infiniband/<hca>/ports/<n>/`).

The files and their formats are the kernel's (drivers/infiniband/core/sysfs.c):
`state` "4: ACTIVE" (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER),
`phys_state` "5: LinkUp" (1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining,
5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test), `rate` "400 Gb/sec (4X NDR)",
`link_layer` "InfiniBand" or "Ethernet" (RoCE), and `counters/<name>` (the IB port
counters `perfquery` shows: symbol_error, link_downed, port_rcv_errors, ...). The
same view: `ibstat`, `ibv_devinfo -v`, `cat /sys/class/infiniband/*/ports/*/state`.

Reading only; `judge_ports` says what the values mean (docs/health.md argues each rule).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck import subject as subjects

INFINIBAND = Path("class/infiniband")
ACTIVE_STATES = (4, 5)  # ACTIVE, ACTIVE_DEFER
PHYS_DISABLED, PHYS_LINK_UP = 3, 5
# The counters read (each a file under counters/); absent ones are left out.
COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery",
            "port_rcv_remote_physical_errors", "local_link_integrity_errors",
            "excessive_buffer_overrun_errors", "port_xmit_discards")
_NUMBERED = re.compile(r"\s*(\d+)\s*:\s*(.*)")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")


@dataclass(frozen=True)
class IbPort:
    """One port of one HCA as sysfs shows it; None where a file is absent or unreadable."""

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
        """"mlx5_0 port 1", as findings name it; its `port` field is the key "mlx5_0/1"
        (the prometheus renderer reads the HCA and port number from it)."""
        return subjects.port(self.key, f"{self.hca} port {self.port}")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def kind(self) -> tuple[str | None, str | None]:
        """Ports compared for speed with each other: the same link layer and HCA model
        (a 25 GbE management port is not a slow 400 Gb/s InfiniBand rail)."""
        return self.link_layer, self.hca_type

    def row(self) -> dict[str, object]:
        return {"port": self.subject, "link_layer": self.link_layer,
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


def _counters(directory: Path) -> dict[str, int]:
    found = {}
    for name in COUNTERS:
        text = _read(directory / name)
        if text is not None and text.isdigit():
            found[name] = int(text)
    return found


def _name(path: Path) -> str:
    """A directory's name as text: bytes that are not UTF-8 as `\\xff`, never as lone
    surrogates, which no report, state file or Prometheus label can carry, so one HCA
    keeps one name in all of them."""
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")


def read_port(hca_dir: Path, port_dir: Path) -> IbPort:
    """`cat state phys_state rate link_layer counters/*` of one port."""
    state, state_name = _numbered(_read(port_dir / "state"))
    phys, phys_name = _numbered(_read(port_dir / "phys_state"))
    rate = _read(port_dir / "rate")
    match = _RATE.match(rate or "")
    return IbPort(_name(hca_dir), int(port_dir.name), state, state_name, phys, phys_name,
                  float(match[1]) if match else None, rate, _read(port_dir / "link_layer"),
                  _read(hca_dir / "hca_type"), _counters(port_dir / "counters"))


def read_ports(sysfs: Path = Path("/sys")) -> list[IbPort] | None:
    """Every port of every HCA, sorted; None when the node has no InfiniBand class at all
    (no RDMA driver loaded), [] when it has the class but no device."""
    root = sysfs / INFINIBAND
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
