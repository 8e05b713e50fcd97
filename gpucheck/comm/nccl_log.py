"""The transport NCCL really used, read from each rank's own NCCL init log and its node's
InfiniBand devices (docs/comm.md, "NCCL transport per rank", shows the lines read)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucheck import subject as subjects
from gpucheck.comm.records import TransportEntry, crossing
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.subject import Subject

LOG_NAME = "nccl.%h.%p.log"
# Interfaces that can never carry traffic between nodes: loopback, container and VM
# bridges, virtual ethernet pairs. A rule anyone can check, unlike "the management NIC".
BAD_PREFIXES = ("lo", "docker", "virbr", "veth")

_USING_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NET_IB = re.compile(r"NCCL INFO NET/IB : Using (.*?)(?:; OOB (\S+?):|$)")
_NET_SOCKET = re.compile(r"NCCL INFO NET/Socket : Using (.*)$")
_DEVICE = re.compile(r"\[\d+\]([^:\s]+):(?:\d+/(IB|RoCE)|\S*)")
_VIA = re.compile(r"NCCL INFO Channel .* via (\S+)")


def nccl_debug_env(environ: Mapping[str, str], log_dir: str, backend: str) -> dict[str, str]:
    """The variables that make NCCL log its transport: none off NCCL or when the user set
    NCCL_DEBUG."""
    if backend != "nccl" or "NCCL_DEBUG" in environ:
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "NCCL_DEBUG_FILE": f"{log_dir.rstrip('/')}/{LOG_NAME}"}


@dataclass(frozen=True)
class Transport:
    """What one rank's log says."""

    network: str | None = None  # "IB", "Socket", or a plugin's name
    ib_devices: tuple[tuple[str, str], ...] = ()  # (device, "IB" or "RoCE")
    oob_interface: str | None = None
    socket_interfaces: tuple[str, ...] = ()
    via: dict[str, int] = field(default_factory=dict)  # channel transports: count

    def row(self) -> dict[str, Any]:
        return {"network": self.network,
                "ib_devices": " ".join(f"{d}/{k}" for d, k in self.ib_devices) or None,
                "oob_interface": self.oob_interface,
                "socket_interfaces": " ".join(self.socket_interfaces) or None,
                "channels": ", ".join(f"{k} x{v}" for k, v in sorted(self.via.items()))
                or None}


def parse_nccl_log(text: str) -> Transport:
    network: str | None = None
    oob: str | None = None
    ib: list[tuple[str, str]] = []
    sockets: list[str] = []
    via: dict[str, int] = {}
    for line in text.splitlines():
        if m := _USING_NETWORK.search(line):
            network = m.group(1)
        elif m := _NET_IB.search(line):
            ib = [(d, k or "IB") for d, k in _DEVICE.findall(m.group(1))]
            oob = m.group(2) or oob
        elif m := _NET_SOCKET.search(line):
            sockets = [d for d, _ in _DEVICE.findall(m.group(1))]
        elif m := _VIA.search(line):
            # "NET/IB/0/GDRDMA" -> "NET/IB", "P2P/CUMEM" -> "P2P", "SHM" -> "SHM"
            parts = m.group(1).split("/")
            kind = "/".join(parts[:2]) if parts[0] == "NET" else parts[0]
            via[kind] = via.get(kind, 0) + 1
    return Transport(network, tuple(dict.fromkeys(ib)), oob, tuple(dict.fromkeys(sockets)),
                     via)


def _uses_sockets(t: Transport) -> bool:
    """Sockets carry the traffic between nodes: NCCL says so, or its log names socket
    interfaces and nothing else (NCCL tries IB before sockets, src/net.cc)."""
    if t.network == "Socket" or "NET/Socket" in t.via:
        return True
    other_net = any(kind.startswith("NET/") for kind in t.via)
    return t.network is None and bool(t.socket_interfaces) and not t.ib_devices and (
        not other_net)


def network_name(t: Transport) -> str | None:
    """The network between nodes: NCCL's own word, else what its log shows; None."""
    if t.network:
        return t.network
    if _uses_sockets(t):
        return "Socket"
    if t.ib_devices or "NET/IB" in t.via:
        return "IB"
    return None


def rank_findings(label: Subject, t: Transport, ib_sysfs: Sequence[str]) -> list[Finding]:
    """One rank's WARNs for traffic between nodes."""
    findings = []
    if _uses_sockets(t) and ib_sysfs:
        findings.append(warn(
            "comm.transport.sockets_with_ib",
            f"{label}: NCCL sends between nodes over sockets although this node has "
            f"InfiniBand devices ({', '.join(ib_sysfs)})",
            hint="NCCL did not load its IB transport: check NCCL_IB_DISABLE, NCCL_NET, "
            "NCCL_IB_HCA, rdma-core/libibverbs in the container and `ibstat`", subject=label))
    wrong = [i for i in t.socket_interfaces if i.startswith(BAD_PREFIXES)] \
        if _uses_sockets(t) else []
    if wrong:
        findings.append(warn(
            "comm.transport.bad_interface",
            f"{label}: NCCL sends between nodes over {', '.join(wrong)}, which cannot "
            "reach another node well (loopback, container or VM bridge)",
            hint="set NCCL_SOCKET_IFNAME to the node's data interface (e.g. "
            "NCCL_SOCKET_IFNAME=^lo,docker,virbr,veth excludes these)", subject=label))
    return findings


def transport_view(entries: Sequence[TransportEntry], labels: Mapping[int, str],
                   backend: str, nodes: int) -> tuple[dict[str, Any], list[Finding]]:
    """The section's data and findings from every rank's entry."""
    if backend != "nccl":
        return {"transport": f"n/a ({backend}): only NCCL logs its transport"}, []
    read = [(e, Transport(d.get("network"), tuple(tuple(x) for x in d.get("ib_devices", ())),
                          d.get("oob_interface"), tuple(d.get("socket_interfaces", ())),
                          dict(d.get("via", {}))))
            for e in entries if e.state == "read" and (d := e.transport) is not None]
    rows = [{"rank": e.rank, "ib_sysfs": " ".join(e.ib_sysfs) or None} | t.row()
            | {"network": network_name(t)} for e, t in read]
    data: dict[str, Any] = {"ranks": rows}
    check = "comm.transport.sockets_with_ib"
    if not read:
        user = any(e.state == "user_nccl_debug" for e in entries)
        reason = ("NCCL_DEBUG was set by the user: left alone, the transport not read"
                  if user else "no NCCL log found: the transport not read")
        return data | {"transport": reason}, [skip(check, reason)]
    if nodes < 2:
        return data | {"between_nodes": "one node: no traffic between nodes"}, []
    findings = [f for e, t in read for f in rank_findings(
        subjects.rank(e.rank, labels.get(e.rank)), t, e.ib_sysfs)]
    if not findings:
        names = {network_name(t) for _, t in read}  # never the word None
        said = sorted(n for n in names if n is not None) + (
            ["a network NCCL's log does not name"] if None in names else [])
        findings = [ok(check, f"{len(read)} ranks send between nodes over "
                       f"{', '.join(said)}, on no loopback or bridge interface")]
    return data, findings


@contextlib.contextmanager
def nccl_logging(backend: str) -> Iterator[str | None]:
    """Set the NCCL_DEBUG variables for this process (restored after); yield the log
    folder, or None when nothing was set."""
    if not nccl_debug_env(os.environ, "/", backend):
        yield None
        return
    folder = tempfile.mkdtemp(prefix="gpucheck-nccl-")
    env = nccl_debug_env(os.environ, folder, backend)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield folder
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(folder, ignore_errors=True)


def ib_sysfs(root: str = "/sys/class/infiniband") -> list[str]:
    """This node's InfiniBand/RoCE devices, as the kernel lists them."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def rank_entry(rank: int, folder: str | None) -> dict[str, Any]:
    """This rank's transport as read from its own log (NCCL names it by host and pid)."""
    logs = [] if folder is None else sorted(Path(folder).glob(f"nccl.*.{os.getpid()}.log"))
    state = "user_nccl_debug" if folder is None else "read" if logs else "no_log"
    transport = asdict(parse_nccl_log(logs[0].read_text(errors="replace"))) if logs else None
    return crossing(TransportEntry(rank, state, transport, tuple(ib_sysfs())))
