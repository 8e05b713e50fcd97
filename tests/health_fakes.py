"""Fakes at the boundary for the `gpucheck health` tests: a sysfs tree of InfiniBand
ports written into a temporary directory, a kernel log file of NVRM lines, and a node
with one fake GPU, a boot id and a state dir that `run_health` checks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
        5: "LinkUp", 6: "LinkErrorRecovery", 7: "Phy Test"}
HEALTHY_COUNTERS = {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0,
                    "link_error_recovery": 0, "port_xmit_discards": 0}


def add_port(sysfs: Path, hca: str, port: int = 1, state: int = 4, phys: int = 5,
             rate: str = "400 Gb/sec (4X NDR)", link_layer: str = "InfiniBand",
             hca_type: str = "MT4129", **counters: int) -> Path:
    """One port as the kernel's drivers/infiniband/core/sysfs.c shows it."""
    hca_dir = sysfs / "class/infiniband" / hca
    port_dir = hca_dir / "ports" / str(port)
    (port_dir / "counters").mkdir(parents=True, exist_ok=True)
    (hca_dir / "hca_type").write_text(f"{hca_type}\n")
    (port_dir / "state").write_text(f"{state}: {STATES[state]}\n")
    (port_dir / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")
    (port_dir / "rate").write_text(f"{rate}\n")
    (port_dir / "link_layer").write_text(f"{link_layer}\n")
    set_counters(sysfs, hca, port, **{**HEALTHY_COUNTERS, **counters})
    return port_dir


def set_counters(sysfs: Path, hca: str, port: int = 1, **counters: int) -> None:
    directory = sysfs / "class/infiniband" / hca / "ports" / str(port) / "counters"
    for name, value in counters.items():
        (directory / name).write_text(f"{value}\n")


def set_state(sysfs: Path, hca: str, port: int, state: int, phys: int) -> None:
    port_dir = sysfs / "class/infiniband" / hca / "ports" / str(port)
    (port_dir / "state").write_text(f"{state}: {STATES[state]}\n")
    (port_dir / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")


def healthy_ib_node(sysfs: Path, rails: int = 4) -> Path:
    """`rails` active 400 Gb/s NDR ports, one per HCA, as on an HGX H200 node."""
    for i in range(rails):
        add_port(sysfs, f"mlx5_{i}")
    return sysfs


def xid_line(seconds: float, bus: str, xid: int, detail: str) -> str:
    """A dmesg line as the driver writes it (open-gpu-kernel-modules krcReportXid)."""
    return f"[{seconds:12.6f}] NVRM: Xid (PCI:{bus}): {xid}, {detail}\n"


def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("[    0.000000] Linux version 6.8.0 (buildd@lcy02)\n" + "".join(lines))
    return path


def add_pci_functions(sysfs: Path, *functions: tuple[str, str]) -> Path:
    """PCI functions as sysfs shows them (/sys/bus/pci/devices/<bdf>/{vendor,class}):
    each a (vendor, class) pair, e.g. ("0x10de", "0x030200") for an NVIDIA 3D controller."""
    devices = sysfs / "bus/pci/devices"
    for i, (vendor, klass) in enumerate(functions):
        device = devices / f"0000:{0x18 + i:02x}:00.0"
        device.mkdir(parents=True, exist_ok=True)
        (device / "vendor").write_text(f"{vendor}\n")
        (device / "class").write_text(f"{klass}\n")
    return sysfs


def gpu_node_sysfs(sysfs: Path, gpus: int = 8) -> Path:
    """An HGX-like bus: `gpus` NVIDIA 3D controllers, NVSwitches (bridges, not GPUs), a
    GPU's audio function and the board's own VGA, which are not counted."""
    return add_pci_functions(sysfs, *[("0x10de", "0x030200")] * gpus,
                             ("0x10de", "0x068000"), ("0x10de", "0x040300"),
                             ("0x1a03", "0x030000"))


BUS = "0000:18:00"
DBE = xid_line(100.5, BUS, 48, "An uncorrectable double bit error (DBE) has been detected.")
PUSH = xid_line(60.0, BUS, 32, "Invalid or corrupted push buffer stream")  # WARN restart-app


def state_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One fake GPU (NVML), an empty sysfs and kernel log, boot "boot-1", a state dir."""
    from tests.fake_pynvml import FakeGpu, FakeNvml

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu()]).module)
    (tmp_path / "sys").mkdir()
    reboot(tmp_path, "boot-1")
    (tmp_path / "state").mkdir(mode=0o755)
    write_log(tmp_path / "dmesg.txt", [])
    return tmp_path


def reboot(node: Path, boot_id: str) -> None:
    boot = node / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text(f"{boot_id}\n")


def run_health(node: Path, lines: list[str] | None = None, *, state: bool = True,
               **options: Any) -> Any:
    """`gpucheck health` on `node` (its kernel log `lines` when given), a 20 s budget."""
    from gpucheck.health.run import HealthOptions, collect_health_report

    if lines is not None:
        write_log(node / "dmesg.txt", lines)
    return collect_health_report(HealthOptions(**{
        "budget_s": 20, "kernel_log": str(node / "dmesg.txt"), "sysfs": node / "sys",
        "proc": node / "proc", "state_dir": node / "state" if state else None, **options}))
