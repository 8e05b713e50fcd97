"""stress's peer phase: the ranks that do not measure wait on the host, never in a
device collective, while their node's local rank 0 times the peer copies.

With fakes of torch.distributed (what each rank asks of it, in order), and with real
gloo CPU ranks: the waiting rank enters the result gather only after rank 0's
measurement is over.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parking_workers import peer_phase_on_cpu

from gpucheck.context import RunContext
from gpucheck.distributed.job import run_job
from gpucheck.distributed.world import World
from gpucheck.stress import copies
from gpucheck.stress.rank import RankContext, StressSpec

HOST_GROUP = object()  # the gloo group the fake new_group hands out


def _world(rank: int, world_size: int = 2) -> World:
    return World(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                 node_rank=0, master_addr="127.0.0.1", master_port=0, launcher="test",
                 device_index=rank)


def _ctx(rank: int, backend: str = "nccl", world_size: int = 2) -> RankContext:
    spec = StressSpec(device="cuda", backend=backend, timeout_s=42.0, dtypes=("bf16",),
                      size=8, duration_s=0.0, warmup_s=0.0, gemm_window_s=0.0,
                      membw_window_s=0.0)
    return RankContext(spec, _world(rank, world_size), torch.device("cpu"), None,
                       RunContext())


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []

    def new_group(ranks: Any = None, timeout: Any = None, backend: str | None = None,
                  use_local_synchronization: bool = False, **kwargs: Any) -> object:
        assert use_local_synchronization  # only the node's ranks take part
        log.append(("new_group", backend, list(ranks), timeout.total_seconds()))
        return HOST_GROUP

    def barrier(group: Any = None, device_ids: Any = None, **kwargs: Any) -> None:
        if device_ids is not None:
            log.append(("device barrier", device_ids))
        else:  # gloo: the new group, or the world group when the job is gloo already
            log.append(("host barrier", "gloo group" if group is HOST_GROUP else "world"))

    def all_gather_object(out: list[Any], mine: Any, *args: Any, **kwargs: Any) -> None:
        log.append(("gather",))
        out[:] = [mine] * len(out)

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "barrier", barrier)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    return log


def _measure(log: list[tuple[Any, ...]]) -> Any:
    def measure(local_world_size: int) -> dict[str, Any]:
        log.append(("measure", local_world_size))
        return {"pairs": []}
    return measure


def test_a_rank_that_does_not_measure_waits_on_the_host_before_any_device_collective(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = _record(monkeypatch)
    assert copies.peer_phase(_ctx(1), _measure(log), [0, 1]) == {"nodes": []}
    assert log == [("new_group", "gloo", [0, 1], 42.0), ("device barrier", [1]),
                   ("host barrier", "gloo group"), ("gather",)]


def test_local_rank_0_measures_then_joins_the_host_wait_then_the_gather(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = _record(monkeypatch)
    result = copies.peer_phase(_ctx(0), _measure(log), [0, 1])
    assert log == [("new_group", "gloo", [0, 1], 42.0), ("device barrier", [0]), ("measure", 2),
                   ("host barrier", "gloo group"), ("gather",)]
    assert [node["node_rank"] for node in result["nodes"]] == [0, 0]  # the fake gathers twice


def test_on_gloo_the_world_group_parks_and_one_rank_parks_nobody(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = _record(monkeypatch)
    copies.peer_phase(_ctx(1, backend="gloo"), _measure(log), [0, 1])
    assert log == [("device barrier", [1]), ("host barrier", "world"), ("gather",)]
    log.clear()
    copies.peer_phase(_ctx(0, world_size=1), _measure(log), [0])
    assert log == [("device barrier", [0]), ("measure", 1), ("gather",)]


def test_on_nccl_each_node_parks_its_own_ranks_and_a_one_rank_node_nobody(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo connects only the processes of one host: a host name that other nodes
    cannot reach (GLOO_SOCKET_IFNAME) cannot break an NCCL job's peer phase."""
    log = _record(monkeypatch)
    copies.peer_phase(_ctx(3, world_size=4), _measure(log), [2, 3])
    assert log[0] == ("new_group", "gloo", [2, 3], 42.0)
    log.clear()
    copies.peer_phase(_ctx(0, world_size=3), _measure(log), [0])  # alone on its node
    assert log == [("device barrier", [0]), ("measure", 3), ("gather",)]


def test_real_ranks_enter_the_gather_only_after_the_matrix_is_measured(
        tmp_path: Path) -> None:
    # Spawned ranks run the phase as on nccl: the node's own gloo group parks rank 1 (the
    # world group parking a gloo job: test_on_gloo_the_world_group_parks_and_one_rank_...).
    results = run_job(peer_phase_on_cpu, (str(tmp_path), ("nccl",)), 2, None, RunContext())
    result = results["nccl"]
    assert result == {"nodes": [{"node_rank": 0, "host": result["nodes"][0]["host"],
                                 "pairs": [], "gpus": 2}]}
    waiting = json.loads((tmp_path / "nccl" / "gather-1.json").read_text())
    assert waiting == {"rank": 1, "matrix_done_at_entry": True}
