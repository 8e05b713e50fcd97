"""Which GPUs this process can really use, and one name for each of them.

Three numberings meet on a GPU node and must not be confused:
- the CUDA ordinal (`cuda:0`, `cuda:1`, ...) counts only the GPUs this process can
  see: it follows CUDA_VISIBLE_DEVICES (and SLURM's per-task binding, which sets
  it), and CUDA's own order;
- the NVML index (`nvidia-smi -i N`) counts every GPU of the machine in PCI order;
- the PCI bus id and the UUID name the physical GPU whatever the numbering.
Every per-GPU row and finding names the GPU by NVML index, bus id and UUID
(`GpuIdentity.label`), so "GPU 3" in one section is GPU 3 in every other, and
`nvidia-smi -i 3` or `nvidia-smi -r -i 3` acts on the right one.

torch is passed in or imported lazily: importing this module never starts CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from gpucheck import subject as subjects

_T = TypeVar("_T")


def cuda_device_count(torch: Any) -> int:
    """How many devices CUDA really enumerates in this process (0 without CUDA).

    Before CUDA is initialised `torch.cuda.device_count()` answers from NVML: the
    physical GPU count, trimmed by CUDA_VISIBLE_DEVICES. Under MIG that is wrong,
    since CUDA enumerates only one MIG instance per process. The CUDA runtime's
    own count (`cudaGetDeviceCount`, which initialises the driver but creates no
    context, so it is safe before spawning workers) is the count that matters.
    """
    try:
        if not torch.cuda.is_available():
            return 0
    except Exception:
        return 0
    runtime_count = getattr(torch._C, "_cuda_getDeviceCount", None)
    try:
        if runtime_count is not None:
            return int(runtime_count())
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def local_device_index(local_rank: int, visible: int) -> int:
    """The CUDA ordinal a rank with this local rank uses, among the `visible` GPUs.

    Under torchrun every rank sees every GPU of the node, so local rank k uses
    `cuda:k`. Under `srun --gpus-per-task=1` (or `--gpu-bind`) each task sees only
    its own GPU, so SLURM_LOCALID 3 must use `cuda:0`: `set_device(3)` would fail
    with "invalid device ordinal". Several ranks sharing fewer GPUs (gloo tests on
    one GPU) are spread over them round-robin. Without the other ranks' view (one rank,
    no store) this is all there is; with it, `device_among_peers` decides.
    """
    if visible <= 0:
        raise ValueError("no CUDA device is visible to this process")
    return local_rank if local_rank < visible else local_rank % visible


def visible_gpu_names(torch: Any, count: int) -> list[str]:
    """What each CUDA ordinal of this process is, in CUDA's order: its UUID (or PCI
    address when this torch gives no UUID; "cuda:N" when neither). Two ranks that list
    the same names see the same GPUs, whatever CUDA_VISIBLE_DEVICES says (a cgroup may
    renumber them)."""
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
    """The CUDA ordinal for this rank: its position among this node's local ranks that
    see the same GPUs (`peers`: local rank -> the GPUs it sees, this rank included).

    `srun --gpu-bind=closest` on a two-socket node gives tasks 0,2,4,6 the first
    socket's four GPUs and tasks 1,3,5,7 the second's; `local_rank % 4` would put
    tasks 0 and 4 on one GPU and leave two GPUs of each socket idle. Counting only the
    ranks that see the same GPUs gives tasks 0,2,4,6 cuda:0,1,2,3 of their socket.
    More such ranks than GPUs (gloo sharing on purpose) wrap round-robin.
    """
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
    """The UUID as nvidia-smi prints it, from torch's device properties: "GPU-..." for a
    whole GPU, "MIG-..." for a MIG instance (`mig`: its GPU has MIG mode on).

    torch gives the bare 16 octets CUDA reports. On a GPU in MIG mode CUDA only ever
    sees a MIG instance, and reports the instance's own UUID (cuDeviceGetUuid_v2:
    "If the device is in MIG mode, returns its MIG UUID"), which nvidia-smi -L and
    CUDA_VISIBLE_DEVICES write "MIG-<uuid>": prefixing it "GPU-" would name a GPU that
    does not exist.
    """
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
        """The GPU a finding is about: `label()` as its words, its index, bus id and UUID
        as fields."""
        return subjects.gpu(self.nvml_index, self.label(), bus_id=self.pci_bus_id,
                            uuid=self.uuid)

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _ask_nvml(bus_id: str | None, nvml: Any | None,
              read: Callable[[Any, Any], _T]) -> _T | None:
    """`read(nvml, handle)` for the GPU at this PCI address; None when NVML cannot tell."""
    if not bus_id:
        return None
    from gpucheck.probes.nvml import Nvml, NvmlFailure

    own = nvml is None
    nvml = nvml or Nvml()
    try:
        return read(nvml, nvml.call("nvmlDeviceGetHandleByPciBusId", bus_id))
    except NvmlFailure:
        return None
    finally:
        if own:
            nvml.shutdown()


def nvml_index_by_bus_id(bus_id: str | None, nvml: Any | None = None) -> int | None:
    """NVML's index of the GPU at this PCI address (None when NVML cannot tell)."""
    return _ask_nvml(bus_id, nvml, lambda n, h: int(n.call("nvmlDeviceGetIndex", h)))


def mig_mode_by_bus_id(bus_id: str | None, nvml: Any | None = None) -> bool:
    """Whether the GPU at this PCI address has MIG mode on (`nvidia-smi --query-gpu=
    mig.mode.current`); False when NVML cannot tell or the GPU has no MIG."""
    modes = _ask_nvml(bus_id, nvml, lambda n, h: n.get("nvmlDeviceGetMigMode", h))
    current = modes[0] if isinstance(modes, (list, tuple)) and modes else modes
    return bool(current)


def _mig_visible() -> bool:
    """CUDA_VISIBLE_DEVICES=MIG-<uuid>,...: CUDA enumerates the first entry, a MIG
    instance (what tells it when NVML cannot)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip().startswith("MIG-")


def cuda_identity(torch: Any, ordinal: int, nvml: Any = None) -> GpuIdentity:
    """Name cuda:<ordinal> of this process by NVML index, bus id and UUID (a MIG
    instance's as "MIG-...")."""
    props = torch.cuda.get_device_properties(ordinal)
    bus_id = bus_id_of(props)
    own = nvml is None and bus_id is not None
    if own:
        from gpucheck.probes.nvml import Nvml

        nvml = Nvml()  # one session for both questions
    try:
        index = nvml_index_by_bus_id(bus_id, nvml)
        mig = mig_mode_by_bus_id(bus_id, nvml) or _mig_visible()
    finally:
        if own:
            nvml.shutdown()
    return GpuIdentity(cuda_ordinal=ordinal, nvml_index=index, name=str(props.name),
                       pci_bus_id=bus_id, uuid=uuid_of(props, mig))


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
