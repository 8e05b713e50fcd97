"""Which GPUs this process can use and one name for each (NVML index, bus id, UUID: the
CUDA ordinal differs per process; docs/env.md "One name per GPU"), a rank's identity, and
how many GPUs this node has, without driver or torch. Importing it never starts CUDA."""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpucheck import subject as subjects


def cuda_device_count(torch: Any) -> int:
    """How many devices the CUDA runtime enumerates here (`cudaGetDeviceCount`: no
    context, safe before spawning; torch's count is NVML's, wrong under MIG); 0 without."""
    try:
        if not torch.cuda.is_available():
            return 0
        runtime_count = getattr(torch._C, "_cuda_getDeviceCount", None)
        return int(runtime_count() if runtime_count is not None else torch.cuda.device_count())
    except Exception:
        return 0


def local_device_index(local_rank: int, visible: int) -> int:
    """The CUDA ordinal of this local rank among the `visible` GPUs, round-robin (a task
    bound to one GPU sees it as cuda:0); `device_among_peers` decides where ranks meet."""
    if visible <= 0:
        raise ValueError("no CUDA device is visible to this process")
    return local_rank if local_rank < visible else local_rank % visible


def visible_gpu_names(torch: Any, count: int) -> list[str]:
    """Each CUDA ordinal's UUID (else PCI address, else "cuda:N"): ranks that list the
    same names see the same GPUs, whatever their numbering."""
    names = []
    for ordinal in range(count):
        try:
            props = torch.cuda.get_device_properties(ordinal)
        except Exception:  # a GPU CUDA enumerates but cannot describe: name it by ordinal
            names.append(f"cuda:{ordinal}")
            continue
        names.append(uuid_of(props) or bus_id_of(props) or f"cuda:{ordinal}")
    return names


def device_among_peers(local_rank: int, mine: Sequence[str],
                       peers: Mapping[int, Sequence[str]]) -> int:
    """This rank's CUDA ordinal: its place among the node's local ranks that see the same
    GPUs (`peers`: local rank -> the GPUs it sees), round-robin past their count."""
    if not mine:
        raise ValueError("no CUDA device is visible to this process")
    same = sorted({r for r, seen in peers.items() if list(seen) == list(mine)} | {local_rank})
    return same.index(local_rank) % len(mine)


def bus_id_of(props: Any) -> str | None:
    """NVML's form of a CUDA device's PCI address ("00000000:9A:00.0"), from torch's
    device properties; None when this torch does not expose it."""
    try:
        domain, bus, device = props.pci_domain_id, props.pci_bus_id, props.pci_device_id
    except AttributeError:
        return None
    return f"{int(domain):08X}:{int(bus):02X}:{int(device):02X}.0"


def uuid_of(props: Any, mig: bool = False) -> str | None:
    """The UUID as nvidia-smi prints it: "GPU-...", or "MIG-..." when its GPU has MIG mode
    on (CUDA then reports the instance's own UUID; docs/env.md "Blackwell and MIG")."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"{'MIG' if mig else 'GPU'}-{text}"


def normal_bus_id(bus_id: str | None) -> str | None:
    """Bus ids compare equal whatever the domain width or case ("0000:9a:00.0")."""
    if not bus_id:
        return None
    parts = bus_id.strip().upper().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


@dataclass(frozen=True)
class GpuIdentity:
    """One physical GPU, as seen from one process."""

    cuda_ordinal: int | None  # cuda:N in this process; None for a GPU it cannot see
    nvml_index: int | None  # nvidia-smi -i N; None when NVML could not tell
    name: str | None
    pci_bus_id: str | None
    uuid: str | None

    def label(self) -> str:
        """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-8c1e...)": the same in every section."""
        head = f"GPU {self.nvml_index}" if self.nvml_index is not None else (
            f"cuda:{self.cuda_ordinal}")
        details = [self.name, self.pci_bus_id and f"bus {self.pci_bus_id}", self.uuid]
        shown = ", ".join(d for d in details if d)
        return f"{head} ({shown})" if shown else head

    def subject(self) -> subjects.Subject:
        """The GPU a finding is about: `label()` with its index, bus id and UUID."""
        return subjects.gpu(self.nvml_index, self.label(), bus_id=self.pci_bus_id,
                            uuid=self.uuid)

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RankInfo:
    """One rank as it checked in."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    device: str  # "cpu", or the CUDA ordinal in this rank's process and name: "cuda:0 NVIDIA H200"
    pid: int
    # The physical GPU on CUDA (None on CPU, or when NVML cannot tell the index).
    nvml_index: int | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    # Where it runs: its CPUs at check-in ("0-27,56-83"), its GPU's NUMA node (sysfs) and
    # whether those CPUs are on that node (`gpucheck.numa.RankNuma`; None: nothing to judge).
    cpus: str | None = None
    numa_node: int | None = None
    on_gpu_numa: bool | None = None

    def describe(self) -> str:
        return (f"rank {self.rank} (node {self.node_rank} {self.host}, local rank "
                f"{self.local_rank}, {device_label(asdict(self))}, pid {self.pid})")


def device_label(info: Mapping[str, Any]) -> str:
    """A check-in record's device as messages name it: "cpu", or
    "cuda:0 = GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)" (NVML index, bus id,
    UUID: cuda:0 alone is a different GPU on every rank under SLURM's binding)."""
    device = str(info.get("device", "unknown device"))
    ordinal, _, name = device.partition(" ")
    if not ordinal.startswith("cuda:"):
        return device
    gpu = GpuIdentity(int(ordinal[5:]) if ordinal[5:].isdigit() else None,
                      info.get("nvml_index"), name or None, info.get("pci_bus_id"),
                      info.get("uuid"))
    return gpu.label() if gpu.nvml_index is None else f"{ordinal} = {gpu.label()}"


# ---- how many GPUs this node has and this process should have (no driver, no torch) ----

SYSFS = Path("/sys")
NVIDIA_PCI_VENDOR = "0x10de"
PCI_DISPLAY_CLASSES = ("0x0300", "0x0302")
SYSFS_VAR = "GPUCHECK_SYSFS"  # where sysfs is (a container with the host's elsewhere)
EXPECT_VAR = "GPUCHECK_EXPECT_GPUS"  # --expect-gpus for every command (a recipe sets it)
NODE_GPUS_VARS = ("SLURM_GPUS_ON_NODE",)  # SLURM's GRES: the GPUs this job has here


@dataclass(frozen=True)
class ExpectedGpus:
    """How many GPUs this process should be able to use, and who says so."""

    count: int
    source: str

    @property
    def stated(self) -> bool:
        """Given by a person: more than that is worth a word too."""
        return self.source in ("--expect-gpus", EXPECT_VAR)


def sysfs_root(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(SYSFS_VAR) or SYSFS)


def expected_gpus(environ: Mapping[str, str], sysfs: Path, option: int | None = None
                  ) -> ExpectedGpus:
    """--expect-gpus (or GPUCHECK_EXPECT_GPUS); else SLURM's GRES on this node; else
    NVIDIA_VISIBLE_DEVICES; else the NVIDIA GPUs on the PCI bus (no driver needed)."""
    if option is not None:
        return ExpectedGpus(option, "--expect-gpus")
    for name in (EXPECT_VAR, *NODE_GPUS_VARS):
        value = environ.get(name, "").strip()
        if value.isdigit() and len(value) <= 4:
            return ExpectedGpus(int(value), name if name == EXPECT_VAR else
                                f"SLURM's GRES ({name}={value})")
    given = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if given in ("none", "void"):  # a container the toolkit was told to give no GPU
        return ExpectedGpus(0, f"NVIDIA_VISIBLE_DEVICES={given}")
    if given and given != "all" and len(given) <= 4096:
        ids = {g.strip() for g in given.split(",") if g.strip()}
        # MIG instances: NVML shows their parent GPUs, of which there is at least one
        count = 1 if any(i.startswith("MIG-") for i in ids) else len(ids)
        return ExpectedGpus(count, f"NVIDIA_VISIBLE_DEVICES ({count} given to this container)")
    return ExpectedGpus(nvidia_pci_devices(str(sysfs / "bus/pci/devices")),
                        "NVIDIA GPUs on the PCI bus")


def nvidia_pci_devices(root: str = "/sys/bus/pci/devices") -> int:
    """NVIDIA display/3D controllers on the PCI bus (`lspci -d 10de:`): the one count of
    a node's GPUs that needs no driver and no torch."""
    count = 0
    for device in glob.glob(f"{glob.escape(root)}/*"):
        try:
            vendor = Path(device, "vendor").read_text().strip()
            klass = Path(device, "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and klass.startswith(PCI_DISPLAY_CLASSES):
            count += 1
    return count
