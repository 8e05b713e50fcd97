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
from dataclasses import asdict, dataclass
from typing import Any


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
    one GPU) are spread over them round-robin.
    """
    if visible <= 0:
        raise ValueError("no CUDA device is visible to this process")
    return local_rank if local_rank < visible else local_rank % visible


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

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _ask_nvml(bus_id: str | None, nvml: Any | None, read: Any) -> Any:
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


def cuda_identity(torch: Any, ordinal: int, nvml: Any | None = None) -> GpuIdentity:
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
