"""Each rank on its own GPU under SLURM's GPU binding (issue 23 item 1): fake CUDA device
counts and SLURM variables, the check-in's exchange on a real c10d store, and the refusal
of two ranks on one GPU UUID."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from gpucheck.devices import RankInfo
from gpucheck.distributed import checkin, job
from gpucheck.distributed.checkin import SharedGpu, View, shared_gpu_groups
from gpucheck.distributed.job import rank_failure_findings
from gpucheck.distributed.session import bind_device
from gpucheck.distributed.world import slurm_world
from gpucheck.report import Status

GPUS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


class FakeCuda:
    """torch as one srun task sees it: only the GPUs its binding leaves visible."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.bound: int | None = None
        self.cuda = SimpleNamespace(is_available=lambda: True,
                                    device_count=lambda: len(uuids),
                                    get_device_properties=self._props,
                                    set_device=self._set)
        self._C = SimpleNamespace(_cuda_getDeviceCount=lambda: len(uuids))

    def _props(self, ordinal: int) -> Any:
        return SimpleNamespace(uuid=self.uuids[ordinal], name="NVIDIA H200")

    def _set(self, ordinal: int) -> None:
        if not 0 <= ordinal < len(self.uuids):
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.bound = ordinal


def closest_binding(task: int) -> list[str]:
    """`srun --ntasks-per-node=8 --gpu-bind=closest` on a two-socket node: Slurm places
    tasks across the sockets in turn (0,2,4,6 on socket 0), each sees its socket's GPUs."""
    return GPUS[:4] if task % 2 == 0 else GPUS[4:]


def slurm_env(task: int) -> dict[str, str]:
    return {"SLURM_PROCID": str(task), "SLURM_LOCALID": str(task), "SLURM_NTASKS": "8",
            "SLURM_STEP_NUM_TASKS": "8", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "8",
            "SLURM_JOB_NODELIST": "gpu01", "SLURM_JOB_ID": "77"}


def _bind_all(views: dict[int, list[str]]) -> dict[int, str]:
    """Every task binds at once, exchanging what it sees on one real c10d store."""
    import torch.distributed as dist

    store = dist.HashStore()
    chosen: dict[int, str] = {}
    errors: list[BaseException] = []

    def task(rank: int) -> None:
        world = slurm_world(slurm_env(rank))
        torch = FakeCuda(views[rank])
        try:
            bound = bind_device("cuda", world, lambda seen: checkin.local_views(
                checkin.exchange_visible(store, world, seen, 30.0), world), torch=torch)
            chosen[rank] = torch.uuids[bound.device_index]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(r,)) for r in views]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(chosen) == len(views)
    return chosen


@pytest.mark.parametrize(("views", "expected"), [
    # closest binding: tasks 0,2,4,6 on GPUs 0-3, tasks 1,3,5,7 on GPUs 4-7
    ({t: closest_binding(t) for t in range(8)}, {t: GPUS[t // 2 + 4 * (t % 2)] for t in range(8)}),
    # one GPU per task, and every GPU visible: the usual choice
    ({t: [GPUS[t]] for t in range(8)}, dict(enumerate(GPUS))),
    ({t: list(GPUS) for t in range(8)}, dict(enumerate(GPUS)))],
    ids=["closest", "one per task", "all visible"])
def test_eight_tasks_bind_eight_gpus_whatever_the_binding(
        views: dict[int, list[str]], expected: dict[int, str]) -> None:
    assert _bind_all(views) == expected


def _info(rank: int, uuid: str, host: str = "gpu01") -> RankInfo:
    return RankInfo(rank, rank, 0, host, f"cuda:{GPUS.index(uuid) % 4} NVIDIA H200", 100 + rank,
                    nvml_index=GPUS.index(uuid), uuid=uuid)


def _views(seen: dict[int, list[str]], host: str = "gpu01") -> dict[int, View]:
    return {r: View(r, host, 0, r, v, "0,1,2,3" if v == GPUS[:4] else "4,5,6,7")
            for r, v in seen.items()}


CLOSEST = _views({t: closest_binding(t) for t in range(8)})


def _old_choice() -> list[RankInfo]:
    """What `local_rank % visible` gave under closest binding: GPUs 0,2,0,2 and 5,7,5,7."""
    return [_info(t, closest_binding(t)[t % 4]) for t in range(8)]


def test_ranks_on_one_gpu_uuid_are_refused_by_name_with_the_launch_setting() -> None:
    infos = _old_choice()
    world = replace(slurm_world(slurm_env(3)), device_index=3)
    with pytest.raises(SharedGpu) as caught:
        checkin.refuse_shared_gpus(infos, CLOSEST, world, "nccl")
    assert caught.value.groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert "--gpu-bind" in str(caught.value) and "CUDA_VISIBLE_DEVICES='4,5,6,7'" in str(
        caught.value)
    roster = [{"rank": i.rank, "local_rank": i.local_rank} for i in infos]
    diagnosis = caught.value.diagnosis  # process_group records it for the report
    assert diagnosis is not None and diagnosis["shared"] == list(range(8))
    failed = job.JobFailed([], None, [diagnosis], roster, reporter=True)
    findings = rank_failure_findings(failed.failures, "bench")
    assert [(f.check, f.status, f.subject.label) for f in findings] == [
        ("bench.shared_gpu", Status.FAIL, f"rank {r}") for r in range(8)]


def test_gloo_ranks_sharing_a_gpu_on_purpose_are_not_refused_but_an_idle_gpu_is() -> None:
    one = _views({0: [GPUS[0]], 1: [GPUS[0]]})
    deliberate = [_info(r, GPUS[0]) for r in range(2)]  # --n-gpus 2 --backend gloo, 1 GPU
    assert shared_gpu_groups(deliberate, one, "gloo") == []
    assert [[i.rank for i in g] for g in shared_gpu_groups(deliberate, one, "nccl")] == [[0, 1]]
    assert [[i.rank for i in g] for g in shared_gpu_groups(_old_choice(), CLOSEST, "gloo")] == [
        [0, 4], [1, 5], [2, 6], [3, 7]]
    fixed = [_info(t, GPUS[t]) for t in range(8)]
    assert shared_gpu_groups(fixed, CLOSEST, "nccl") == []
    other_host = [_info(0, GPUS[0]), _info(1, GPUS[0], host="gpu02")]
    assert shared_gpu_groups(other_host, one, "nccl") == []
