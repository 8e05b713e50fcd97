"""NUMA placement: sysfs reading against a fake tree, the check-in record, the pure
`ranks.numa` verdict (healthy and faulty placements), and the env GPU table's NUMA fields
against the fake pynvml."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from gpucheck import numa
from gpucheck.devices import GpuIdentity, RankInfo
from gpucheck.distributed.checkin import this_rank
from gpucheck.distributed.nodes import numa_findings
from gpucheck.distributed.world import World
from gpucheck.report import Status
from tests.fake_pynvml import FakeGpu, FakeNvml, probe

BUS = "00000000:9A:00.0"  # NVML's form; sysfs has 0000:9a:00.0
TWO_SOCKETS = {0: "0-3,8-11", 1: "4-7,12-15"}


def fake_machine(root: Path, nodes: dict[int, str], gpus: dict[str, int | None]) -> Path:
    """A sysfs tree: `nodes` (node -> cpulist) online, each GPU (bus id -> its node, None
    for -1) with its numa_node and local_cpulist (every CPU when -1, as VMs show)."""
    folder = root / "devices" / "system" / "node"
    folder.mkdir(parents=True)
    (folder / "online").write_text(numa.cpulist(tuple(nodes)) + "\n")
    for node, cpus in nodes.items():
        (folder / f"node{node}").mkdir()
        (folder / f"node{node}" / "cpulist").write_text(cpus + "\n")
    every = numa.cpulist(tuple(c for text in nodes.values() for c in numa.parse_cpulist(text)))
    for bus, node in gpus.items():
        device = numa.pci_dir(bus, root)
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{-1 if node is None else node}\n")
        (device / "local_cpulist").write_text((every if node is None else nodes[node]) + "\n")
    return root


def cpus(text: str) -> tuple[int, ...]:
    return numa.parse_cpulist(text)


# --- sysfs ------------------------------------------------------------------------------


def test_a_gpus_node_and_its_nodes_cpus_are_read_from_sysfs(tmp_path: Path) -> None:
    fake_machine(tmp_path, TWO_SOCKETS, {BUS: 1})
    assert numa.numa_nodes(tmp_path) == (0, 1)
    assert numa.read_numa_node(BUS, tmp_path) == 1
    assert numa.node_cpus(1, tmp_path) == cpus("4-7,12-15")


def test_without_an_online_file_the_node_folders_are_counted(tmp_path: Path) -> None:
    fake_machine(tmp_path, TWO_SOCKETS, {})
    (tmp_path / "devices" / "system" / "node" / "online").unlink()
    assert numa.numa_nodes(tmp_path) == (0, 1)


def test_a_machine_without_sysfs_has_no_numa_nodes(tmp_path: Path) -> None:
    assert numa.numa_nodes(tmp_path) == ()
    assert numa.read_numa_node(BUS, tmp_path) is None


# --- one rank against its GPU's node ------------------------------------------------------


@pytest.mark.parametrize(("allowed", "on_gpu_numa"), [
    ("4-7", True),  # pinned on the GPU's node
    ("5", True),
    ("0-3", False),  # pinned on the other node
    ("0-3,8-11", False),
    ("0-15", None),  # not pinned: every CPU
    ("2-5", None),  # a cpuset across both nodes
])
def test_a_ranks_cpus_are_judged_against_its_gpus_node(tmp_path: Path, allowed: str,
                                                        on_gpu_numa: bool | None) -> None:
    fake_machine(tmp_path, TWO_SOCKETS, {BUS: 1})
    place = numa.rank_numa(BUS, cpus(allowed), tmp_path)
    assert (place.cpus, place.numa_node, place.on_gpu_numa) == (allowed, 1, on_gpu_numa)


@pytest.mark.parametrize(("nodes", "placed", "bus", "expected"), [
    (TWO_SOCKETS, None, BUS, numa.RankNuma("0-3", None, None)),
    ({0: "0-15"}, 0, BUS, numa.RankNuma("0-3", 0, None)),
    (TWO_SOCKETS, 1, None, numa.RankNuma("0-3", None, None)),
], ids=["no numa info", "one node", "cpu rank"])
def test_a_rank_with_nothing_to_judge_records_its_cpus_only(
        tmp_path: Path, nodes: dict[int, str], placed: int | None, bus: str | None,
        expected: numa.RankNuma) -> None:
    fake_machine(tmp_path, nodes, {BUS: placed})
    assert numa.rank_numa(bus, cpus("0-3"), tmp_path) == expected


def test_the_check_in_record_carries_the_ranks_cpus_and_its_gpus_node(tmp_path: Path) -> None:
    """This process's real affinity, on a fake machine whose other node holds the GPU."""
    mine = tuple(sorted(os.sched_getaffinity(0)))
    fake_machine(tmp_path, {0: numa.cpulist(mine), 1: "4096-4097"}, {BUS: 1})
    world = World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                  master_addr="127.0.0.1", master_port=0, launcher="torchrun")
    gpu = GpuIdentity(1, 3, "NVIDIA H200", BUS, "GPU-3")
    info = this_rank(world, gpu, tmp_path)
    assert (info.cpus, info.numa_node, info.on_gpu_numa) == (numa.cpulist(mine), 1, False)
    assert RankInfo(**json.loads(json.dumps(asdict(info)))) == info  # as the store holds it
    assert this_rank(world, None, tmp_path).on_gpu_numa is None


# --- the ranks.numa verdict -------------------------------------------------------------


def rank_row(rank: int, on_gpu_numa: bool | None, numa_node: int | None = 1,
             cpus: str = "0-3", device: str = "cuda") -> dict[str, Any]:
    row = {"rank": rank, "local_rank": rank, "node_rank": 0, "host": "node7", "pid": 100 + rank,
           "cpus": cpus, "numa_node": numa_node, "on_gpu_numa": on_gpu_numa,
           "device": "cpu", "nvml_index": None, "pci_bus_id": None, "uuid": None}
    if device == "cuda":
        row |= {"device": f"cuda:{rank} NVIDIA H200", "nvml_index": rank,
                "pci_bus_id": f"00000000:{0x18 + rank:02X}:00.0", "uuid": f"GPU-{rank}"}
    return row


@pytest.mark.parametrize("ranks", [
    [rank_row(0, None, numa_node=0), rank_row(1, None, numa_node=0)],  # one NUMA node
    [rank_row(0, None, numa_node=None), rank_row(1, None, numa_node=None)],  # numa_node -1
    [rank_row(0, None, cpus="0-15"), rank_row(1, None, cpus="0-15")],  # not pinned
    [rank_row(0, None, None, device="cpu"), rank_row(1, None, None, device="cpu")],
], ids=["one node", "no numa info", "not pinned", "cpu ranks"])
def test_placements_with_nothing_to_judge_give_no_finding(ranks: list[dict]) -> None:
    assert numa_findings(ranks) == []


def test_ranks_pinned_on_their_gpus_node_are_ok_once() -> None:
    findings = numa_findings([rank_row(r, True, cpus="4-7") for r in range(4)])
    assert [(f.check, f.status) for f in findings] == [("ranks.numa", Status.OK)]
    assert "rank(s) 0-3" in findings[0].message


def test_a_rank_pinned_on_the_other_node_is_warned_with_its_gpu_named() -> None:
    findings = numa_findings([rank_row(0, True, cpus="4-7"), rank_row(1, False, cpus="0-3")])
    warned = [f for f in findings if f.status is Status.WARN]
    assert len(warned) == 1 and warned[0].check == "ranks.numa"
    assert warned[0].subject is not None
    assert warned[0].subject.label.startswith("rank 1 (cuda:1 = GPU 1")
    assert "CPUs 0-3" in warned[0].message and "NUMA node 1" in warned[0].message
    assert warned[0].hint is not None and "numactl --cpunodebind=1" in warned[0].hint
    assert "--numa-binding" in warned[0].hint


def test_the_hint_names_a_torchrun_option_this_torch_has() -> None:
    import torch.distributed.run as run

    assert "--numa-binding" in Path(run.__file__).read_text()


# --- env: the GPU table -----------------------------------------------------------------


def four_gpus(nodes: dict[int, str]) -> list[FakeGpu]:
    """GPU 0-1 on node 0, GPU 2-3 on the last node, each with that node's CPUs."""
    last = max(nodes)
    return [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                    cpu_affinity=cpus(nodes[0 if i < 2 else last])) for i in range(4)]


def test_env_shows_each_gpus_numa_node_and_cpus_and_one_ok_per_node(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpus = four_gpus(TWO_SOCKETS)
    fake_machine(tmp_path, TWO_SOCKETS, {g.bus_id: 0 if i < 2 else 1 for i, g in enumerate(gpus)})
    section = probe(monkeypatch, FakeNvml(gpus), sysfs=tmp_path).sections[1]
    rows = section.data["gpus"]
    assert [(r["numa_node"], r["cpu_affinity"]) for r in rows] == \
        [(0, "0-3,8-11"), (0, "0-3,8-11"), (1, "4-7,12-15"), (1, "4-7,12-15")]
    found = [(f.status, f.subject and f.subject.label, f.message) for f in section.findings
             if f.check == "gpu.numa"]
    assert found == [(Status.OK, "NUMA node 0", "GPU 0-1 on NUMA node 0 (CPUs 0-3,8-11)"),
                     (Status.OK, "NUMA node 1", "GPU 2-3 on NUMA node 1 (CPUs 4-7,12-15)")]


@pytest.mark.parametrize(("nodes", "absent"), [
    ({0: "0-55,112-167", 1: "56-111,168-223"}, frozenset()),  # past the first 64: bitmask
    (TWO_SOCKETS, frozenset({"nvmlDeviceGetCpuAffinity"})),  # without it: sysfs
], ids=["nvml bitmask", "sysfs"])
def test_a_gpus_cpus_come_from_nvmls_bitmask_else_from_sysfs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nodes: dict[int, str],
        absent: frozenset[str]) -> None:
    gpus = four_gpus(nodes)
    fake_machine(tmp_path, nodes, {g.bus_id: 0 if i < 2 else 1 for i, g in enumerate(gpus)})
    result = probe(monkeypatch, FakeNvml(gpus, absent=absent), sysfs=tmp_path)
    rows = result.sections[1].data["gpus"]
    assert rows[3]["cpu_affinity"] == nodes[1]


@pytest.mark.parametrize(("nodes", "placed"), [
    ({0: "0-15"}, 0),  # one NUMA node
    (TWO_SOCKETS, None),  # numa_node -1 on every GPU
], ids=["one node", "no numa info"])
def test_env_says_nothing_about_numa_where_there_is_nothing_to_say(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nodes: dict[int, str],
        placed: int | None) -> None:
    gpus = four_gpus(nodes)
    fake_machine(tmp_path, nodes, {g.bus_id: placed for g in gpus})
    result = probe(monkeypatch, FakeNvml(gpus), sysfs=tmp_path)
    assert [r["numa_node"] for r in result.sections[1].data["gpus"]] == [placed] * 4
    assert not [f for s in result.sections for f in s.findings if f.check == "gpu.numa"]
    assert {f.status for s in result.sections for f in s.findings} == {Status.OK}


# --- the load commands' reports ---------------------------------------------------------


def test_comms_setup_section_warns_of_a_rank_off_its_gpus_node() -> None:
    from gpucheck.comm.report import Verdicts, comm_sections

    result = {"world_size": 2, "device": "cuda", "backend": "nccl", "sizes_bytes": [1 << 20],
              "iters": 5, "warmup": 1, "complete": True, "pairwise": None, "collectives": {},
              "ranks": [rank_row(0, True, cpus="4-7"), rank_row(1, False, cpus="0-3")]}
    setup = comm_sections(result, Verdicts(0.5, None, 0.8))[0]
    assert [(f.check, f.status, f.subject and f.subject.label[:6]) for f in setup.findings] == \
        [("ranks.numa", Status.WARN, "rank 1"), ("ranks.numa", Status.OK, None)]
    assert setup.data["ranks"][1]["cpus"] == "0-3"


def test_benchs_setup_section_warns_of_a_rank_off_its_gpus_node() -> None:
    from gpucheck.bench.findings import setup_section
    from gpucheck.bench.model import ImageSet, WeightsChoice
    from gpucheck.bench.records import RankRecord
    from gpucheck.bench.worker import BenchOutcome, BenchSpec

    spec = BenchSpec(model="resnet50", weights=WeightsChoice("random"), dtype="bf16",
                     channels_last=True, batch_size=8, warmup=1, iters=2, duration_s=None,
                     device="cuda", backend="nccl", timeout_s=30.0, images_dir="/x",
                     files=("a.png",), progress=False)
    records = tuple(RankRecord(rank=r, host="node7", node_rank=0, local_rank=r,
                               device=f"cuda:{r}", device_name="NVIDIA H200",
                               device_uuid=None, images=16, iters=2, wall_s=1.0, span_s=1.0,
                               device_s=1.0, peak_memory_bytes=None, threads=4)
                    for r in range(2))
    outcome = BenchOutcome(records=records, outputs=(), padding=0, per_rank_images=1,
                           ranks=(rank_row(0, True, cpus="4-7"), rank_row(1, False, cpus="0-3")))
    setup = setup_section(spec, ImageSet("/x", ("a.png",), ()), outcome)
    numa = [(f.status, f.subject and f.subject.label[:6]) for f in setup.findings
            if f.check == "ranks.numa"]
    assert numa == [(Status.WARN, "rank 1"), (Status.OK, None)]
    assert setup.data["rank_placement"][1]["cpus"] == "0-3"
