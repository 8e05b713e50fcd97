"""Host<->device copies through pinned memory, and peer copies between GPUs.

Host copies count the bytes once (one direction over the PCIe link), so they
compare with the link's one-direction rate (`gpucheck.stress.numa.link_rate_gbps`).
Each rate is the buffer over the median copy's time.

Peer copies need one process that sees both GPUs: with one process per GPU, a copy
into another rank's memory would need CUDA IPC handles. So each node's local rank 0
measures the whole matrix in a separate step, opening every GPU it can see, while
the other ranks wait on the host, off their GPUs (`gpucheck.stress.parking`); when
it sees only its own GPU (CUDA_VISIBLE_DEVICES, srun --gpus-per-task) the matrix is
skipped with that reason. A slow pair is measured again before it is judged
(`second_look`, the rules of `gpucheck.peers.eliminate`).

A pair is compared only with pairs of its own path class (`nvidia-smi topo -m`:
NV#, PIX, PXB, PHB, NODE, SYS; `gpucheck.probes.topology.pair_paths`): on H100/H200
NVL (NVLink bridges in pairs), L40S or any two-socket PCIe box, pairs across a bridge,
switch or socket are slower by design, and a median over all of them would condemn
the slower kind.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.devices import cuda_device_count
from gpucheck.measure import Better, Bound
from gpucheck.peers import Suspects, eliminate
from gpucheck.probes.topology import path_class as topology_class
from gpucheck.probes.topology import paths_or_none
from gpucheck.timing import timed_batch

HOST_COPY_BYTES = 256 << 20
PEER_COPY_BYTES = 256 << 20
COPY_ITERS = 10


@dataclass(frozen=True)
class HostCopies:
    """One rank's pinned-memory copy rates in one setting ("alone" or "together")."""

    rank: int
    setting: str
    size_bytes: int
    h2d_gbps: float
    d2h_gbps: float


def _gbps(size: int, times_s: list[float]) -> float:
    return size / statistics.median(times_s) / 1e9


def host_copies(rank: int, setting: str, host: Any, dev: Any) -> HostCopies:
    """Time COPY_ITERS copies each way between a pinned host buffer and the GPU."""
    import torch

    dev.copy_(host, non_blocking=True)  # warm-up: first use of the copy engines
    host.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    h2d = timed_batch(lambda i: dev.copy_(host, non_blocking=True), COPY_ITERS, "cuda")
    d2h = timed_batch(lambda i: host.copy_(dev, non_blocking=True), COPY_ITERS, "cuda")
    size = host.numel() * host.element_size()
    return HostCopies(rank, setting, size, _gbps(size, h2d), _gbps(size, d2h))


def copy_buffers(device: Any, size: int = HOST_COPY_BYTES) -> tuple[Any, Any]:
    """(pinned host buffer, device buffer). Allocate after the rank is placed on its
    GPU's NUMA node: pinned pages land on the node of the thread touching them."""
    import torch

    host = torch.ones(size, dtype=torch.uint8, pin_memory=True)
    return host, torch.empty(size, dtype=torch.uint8, device=device)


def peer_matrix(local_world_size: int, fraction: float = 0.6) -> dict[str, Any]:
    """Every ordered pair of the GPUs this process sees: peer access and GB/s; the
    slow pairs measured again beside a known-good pair (`second_look`).

    {"gpus": [identity rows], "pairs": [{src, dst, peer_access, gbps}],
    "again": [the same rows, second look; only when a pair was slow]}, or
    {"skipped": reason}.
    """
    import torch

    from gpucheck.probes.nvml import cuda_identity

    visible = cuda_device_count(torch)
    if visible < 2 and local_world_size < 2:
        return {"skipped": "one GPU in this run on this node: no peer to copy to"}
    if visible < 2:
        return {"skipped": "this process sees one GPU (CUDA_VISIBLE_DEVICES or srun "
                "--gpus-per-task): peer copies need one process that sees every GPU"}
    if visible < local_world_size:
        return {"skipped": f"local rank 0 sees {visible} of the node's {local_world_size} "
                "GPUs: peer copies need one process that sees every GPU"}
    gpus = [cuda_identity(torch, i).row() for i in range(visible)]
    paths, why = paths_or_none([g.get("pci_bus_id") for g in gpus])
    every = [(s, d) for s in range(visible) for d in range(visible) if s != d]
    try:
        pairs = with_paths(_measure_pairs(visible, every), paths)
        again = second_look(pairs, fraction, lambda wanted: _measure_pairs(visible, wanted))
    except RuntimeError as exc:  # e.g. exclusive-process compute mode: no second context
        return {"gpus": gpus, "skipped": f"could not open every GPU from one process: "
                f"{str(exc).strip().splitlines()[0][:200]}"}
    return {"gpus": gpus, "pairs": pairs} | ({"again": again} if again else {}) | \
        ({"paths_unread": why} if why else {})


def with_paths(pairs: list[dict[str, Any]], paths: Mapping[tuple[int, int], Any],
               ) -> list[dict[str, Any]]:
    """Each pair row with its path class and P2P status (`PairPath.row`), when known."""
    return [p | (paths[(p["src"], p["dst"])].row() if (p["src"], p["dst"]) in paths else {})
            for p in pairs]


def path_class(pair: Mapping[str, Any]) -> str:
    """The class a pair is compared within: its path, NV# as one class
    (`gpucheck.probes.topology.path_class`; "" when not read: one class)."""
    return topology_class(pair.get("path"))


def class_suspects(pairs: list[dict[str, Any]], fraction: float) -> dict[str, Suspects]:
    """Per path class, the slow pairs (and a GPU whose every pair one way is slow) by
    `gpucheck.peers.eliminate` against the median pair of that class."""
    by_class: dict[str, list[dict[str, Any]]] = {}
    for p in pairs:
        if p["gbps"] is not None:  # a pair without peer access has nothing to compare
            by_class.setdefault(path_class(p), []).append(p)
    return {kind: peer_suspects(members, fraction) for kind, members in sorted(by_class.items())}


def peer_suspects(pairs: list[dict[str, Any]], fraction: float) -> Suspects:
    """The slow pairs (and a GPU whose every pair one way is slow) by
    `gpucheck.peers.eliminate`, the same rule as comm's send/recv pairs."""
    return eliminate(samples_of(pairs), Bound.fraction(fraction, Better.HIGHER))


def samples_of(pairs: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """Each measured pair's reading (one per pair: the median copy's rate)."""
    return {(p["src"], p["dst"]): [p["gbps"]] for p in pairs if p["gbps"] is not None}


def second_look(pairs: list[dict[str, Any]], fraction: float,
                measure: Callable[[list[tuple[int, int]]], list[dict[str, Any]]],
                ) -> list[dict[str, Any]]:
    """Confirm before condemning: the known-good reference pair(s), then every slow
    pair, measured again by this same process (the node's other ranks are still
    parked, `gpucheck.stress.parking`, so nothing else runs on the GPUs; only this
    process measures, so no other rank has to agree on the plan). [] when nothing
    is slow."""
    plans = [s for s in class_suspects(pairs, fraction).values() if not s.empty]
    if not plans:
        return []
    wanted = [pair for s in plans for pair in (*s.references, *s.pairs)]
    return measure(list(dict.fromkeys(wanted)))


def _measure_pairs(visible: int, wanted: list[tuple[int, int]]) -> list[dict[str, Any]]:
    import torch

    buffers = [torch.ones(PEER_COPY_BYTES, dtype=torch.uint8, device=f"cuda:{i}")
               for i in range(visible)]
    landing = [torch.empty_like(b) for b in buffers]
    pairs = []
    for src, dst in wanted:
        access = bool(torch.cuda.can_device_access_peer(src, dst))
        gbps = _pair_gbps(buffers[src], landing[dst]) if access else None
        pairs.append({"src": src, "dst": dst, "peer_access": access, "gbps": gbps})
    del buffers, landing
    torch.cuda.empty_cache()
    return pairs


def _pair_gbps(src: Any, dst: Any) -> float:
    """torch copies across GPUs on the source's current stream, so events there time it."""
    import torch

    with torch.cuda.device(src.device):
        dst.copy_(src)
        torch.cuda.synchronize(src.device)
        torch.cuda.synchronize(dst.device)
        times = timed_batch(lambda i: dst.copy_(src, non_blocking=True), COPY_ITERS, "cuda")
        torch.cuda.synchronize(dst.device)
    return _gbps(src.numel(), times)
