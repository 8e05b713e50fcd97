"""The CUDA paths of the rank frame and of bench, on a machine without a GPU.

A fake CUDA (`FakeCuda`) answers like a process that sees `visible` GPUs out of
more physical ones: an ordinal it cannot see fails with "invalid device ordinal",
as real CUDA does under `srun --gpus-per-task=1` or with MIG. The process group
itself is real (gloo, one rank), so only the device calls are faked.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from comm_workers import free_port

from gpucheck.bench import model as bench_model
from gpucheck.bench import worker as bench_worker
from gpucheck.bench.model import WeightsChoice
from gpucheck.commands import launch
from gpucheck.context import RunContext
from gpucheck.distributed.session import process_group, roster

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "GPUCHECK_RUN_DIR")


def bus_id(physical: int) -> str:
    return f"00000000:{0x18 + physical:02X}:00.0"


@dataclass
class FakeCuda:
    """CUDA as a process sees it: `physical[i]` is the NVML index behind cuda:i."""

    physical: list[int]
    nvml_count: int  # what torch.cuda.device_count() says before CUDA starts
    calls: list[tuple[str, int]] = field(default_factory=list)

    def _check(self, what: str, index: Any) -> int:
        index = int(getattr(index, "index", index) or 0)
        self.calls.append((what, index))
        if not 0 <= index < len(self.physical):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def props(self, index: Any) -> SimpleNamespace:
        gpu = self.physical[self._check("props", index)]
        return SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                               pci_domain_id=0,
                               pci_bus_id=0x18 + gpu, pci_device_id=0,
                               uuid=f"00000000-0000-0000-0000-{gpu:012d}")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch

        from gpucheck.probes import nvml

        by_bus = {bus_id(p): p for p in self.physical}
        patches: dict[str, Any] = {
            "is_available": lambda: True,
            "device_count": lambda: self.nvml_count,
            "set_device": lambda i: self._check("set_device", i),
            "get_device_properties": self.props,
            "get_device_name": lambda i=0: self.props(i).name,
            "reset_peak_memory_stats": lambda i=None: self._check("reset_peak", i),
            "max_memory_allocated": lambda i=None: self._check("peak", i) + 1000,
        }
        for name, fake in patches.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: len(self.physical))
        monkeypatch.setattr(nvml, "nvml_index_and_mig",
                            lambda bus, nvml=None: (by_bus.get(bus or ""), False))


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch


def here() -> RunContext:
    """The context this process is given where a run starts: its environment as the
    test set it (cli.program reads it the same way)."""
    import os

    return RunContext(launcher_env=dict(os.environ))


def srun_task(monkeypatch: pytest.MonkeyPatch, local_id: int) -> None:
    """This process as an srun task with SLURM_LOCALID `local_id` (a one-task step, so
    the process group needs no peer)."""
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_LOCALID", str(local_id))
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


def launch_args(**given: Any) -> argparse.Namespace:
    values = {"timeout": 30.0, "device": None, "n_gpus": None, "backend": "gloo",
              "master_port": None} | given
    return argparse.Namespace(**values)


@pytest.mark.parametrize(("nvml_count", "n_gpus", "backend", "nproc"), [
    (2, None, "gloo", 1),  # MIG-a,MIG-b: NVML counts 2, CUDA enumerates only the first
    (2, 2, "nccl", None),  # more NCCL ranks than the GPUs CUDA gives: a usage error
    # gloo ranks on one GPU: how a GPU-less CI-style check of the CUDA paths runs there
    (1, 2, "gloo", 2)])
def test_the_rank_count_is_cudas_count_not_nvmls_and_only_gloo_ranks_share(
        no_launcher: pytest.MonkeyPatch, nvml_count: int, n_gpus: int | None, backend: str,
        nproc: int | None) -> None:
    from gpucheck.errors import UsageError

    FakeCuda(physical=[0], nvml_count=nvml_count).install(no_launcher)
    args = launch_args(n_gpus=n_gpus, backend=backend)
    if nproc is None:
        with pytest.raises(UsageError, match="only 1 GPU"):
            launch.plan_launch(args, here())
        return
    plan = launch.plan_launch(args, here())
    assert (plan.device, plan.nproc, plan.backend) == ("cuda", nproc, backend)


def test_an_srun_task_bound_to_one_gpu_uses_cuda_0_whatever_its_local_id(
        no_launcher: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(physical=[3], nvml_count=1)
    cuda.install(no_launcher)
    srun_task(no_launcher, local_id=3)
    ctx = here()
    with process_group("gloo", "cuda", timeout_s=30, ctx=ctx) as world:
        me = roster(ctx)[0]
    assert world.local_rank == 3 and world.device_index == 0
    assert ("set_device", 0) in cuda.calls
    assert me.device == "cuda:0 NVIDIA H200"
    assert (me.nvml_index, me.pci_bus_id, me.uuid) == (
        3, bus_id(3), "GPU-00000000-0000-0000-0000-000000000003")
    # Failure messages name the physical GPU, not only cuda:0.
    assert "cuda:0 = GPU 3 (NVIDIA H200, bus 00000000:1B:00.0, GPU-" in me.describe()


def test_under_torchrun_local_rank_k_uses_cuda_k_and_names_its_gpu(
        no_launcher: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(physical=[4, 5, 6], nvml_count=3)
    cuda.install(no_launcher)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        no_launcher.setenv(name, value)
    ctx = here()
    with process_group("gloo", "cuda", timeout_s=30, ctx=ctx) as world:
        me = roster(ctx)[0]
    assert world.device_index == 2
    assert me.nvml_index == 6 and "cuda:2 = GPU 6 (" in me.describe()


def bench_spec() -> bench_worker.BenchSpec:
    return bench_worker.BenchSpec(
        model="resnet18", weights=WeightsChoice("random"), dtype="fp16", channels_last=True,
        batch_size=2, warmup=0, iters=1, duration_s=None, device="cuda", backend="gloo",
        timeout_s=30, images_dir=".", files=("a.png",), progress=False)


def test_bench_times_and_records_the_gpu_the_task_sees_not_its_local_id(
        no_launcher: pytest.MonkeyPatch) -> None:

    cuda = FakeCuda(physical=[3], nvml_count=1)
    cuda.install(no_launcher)
    srun_task(no_launcher, local_id=3)
    spec = bench_spec()
    ctx = here()
    with process_group("gloo", "cuda", timeout_s=30, ctx=ctx) as world:
        assert str(bench_worker._device(spec, world)) == "cuda:0"
        given = {"wall_s": 1.0, "span_s": 1.0, "device_s": 0.9, "iter_ms": (900.0,),
                 "iter_end_ms": (1000.0,), "iter_wall_ms": (1000.0,), "segments": 1}
        timing = bench_worker.LoopTiming(**{f.name: given[f.name] for f in
                                            dataclasses.fields(bench_worker.LoopTiming)})
        record = bench_worker._record(spec, world, 1, timing, 1, ctx)
    assert (record.device, record.local_rank, record.nvml_index) == ("cuda:0", 3, 3)
    assert record.pci_bus_id == bus_id(3) and record.device_uuid.endswith("000000000003")
    assert record.peak_memory_bytes == 1000  # read from cuda:0
    assert record.gpu_label().startswith("GPU 3 (NVIDIA H200, bus 00000000:1B:00.0")


@pytest.mark.parametrize(("emulated_only", "expected"), [(True, "fp16"), (False, "bf16")])
def test_auto_dtype_picks_bf16_only_where_the_gpu_has_it_natively(
        monkeypatch: pytest.MonkeyPatch, emulated_only: bool, expected: str) -> None:
    import torch

    # Pre-Ampere (a V100, a T4): torch says bf16 "is supported" counting the emulation.
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return including_emulation or not emulated_only

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert bench_model.resolve_dtype("auto", "cuda") == expected
    assert bench_model.resolve_dtype("auto", "cpu") == "fp32"


def test_a_silent_rank_is_named_by_its_physical_gpu_in_the_failure() -> None:
    from gpucheck.distributed.job import blame

    roster_rows = [{"rank": 1, "local_rank": 1, "node_rank": 0, "host": "node0",
                    "device": "cuda:0 NVIDIA H200", "pid": 42, "nvml_index": 5,
                    "pci_bus_id": bus_id(5), "uuid": "GPU-5"}]
    diagnoses = [{"rank": 0, "missing": [1], "step": "timed loop", "cause": "timed out"}]
    [failure] = blame([], diagnoses, roster_rows)
    assert failure.cause == "did not answer"
    assert "cuda:0 = GPU 5 (NVIDIA H200, bus 00000000:1D:00.0, GPU-5)" in failure.message


def test_comms_barrier_names_the_ranks_gpu_to_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without device_ids, NCCL's barrier warns "using the device under current context".
    import torch
    import torch.distributed as dist

    from gpucheck.comm import collectives, pairwise
    from gpucheck.distributed import session

    calls: list[Any] = []
    monkeypatch.setattr(dist, "barrier", lambda **kw: calls.append(kw.get("device_ids")))
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # bind_device set it
    from gpucheck.bench import worker as bench_worker

    assert collectives.barrier is session.barrier and pairwise.barrier is session.barrier
    assert bench_worker.barrier is session.barrier
    session.barrier(1.0)  # bench's barriers are this one too (bench.worker imports it)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    session.barrier(1.0)
    assert calls == [[3], None]
