"""The launch frame with real processes: gloo on loopback, elastic launcher."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from dist_workers import fail_on_rank_one, gather_ranks, gather_without_rank_one

from gpucheck.context import RunContext
from gpucheck.distributed.job import JobFailed, resolve_nproc, run_job
from gpucheck.distributed.launch import (
    WorkersFailed,
    _launch_config,
    launch_local,
)
from gpucheck.distributed.world import World, agent_serves_store, world_from_env
from gpucheck.errors import UsageError


def test_run_job_one_rank_runs_in_this_process() -> None:
    import os

    records = run_job(gather_ranks, "solo", 1, None, RunContext())
    assert records == [{"rank": 0, "tag": "solo", "pid": os.getpid()}]


def test_run_job_gathers_every_rank_through_the_elastic_launcher() -> None:
    # Two ranks: the launch path (three self-launched ranks run in test_bench_runs.py,
    # test_comm_collectives.py and test_stress_runs.py).
    records = run_job(gather_ranks, "many", 2, None, RunContext())
    assert [r["rank"] for r in records] == [0, 1]
    assert len({r["pid"] for r in records}) == 2


def test_launch_local_names_the_rank_that_failed() -> None:
    with pytest.raises(WorkersFailed) as caught:
        launch_local(fail_on_rank_one, ("boom from rank one",), 2)
    failed = {f.rank: f for f in caught.value.failures}
    assert 1 in failed
    assert "boom from rank one" in failed[1].message


def test_an_object_collective_a_rank_never_joins_ends_at_its_groups_deadline() -> None:
    """Objects cross on the session's object group, under its timeout (1 s), not the
    default group's (10 s): gloo's error names the 1000 ms, and the rank is named."""
    with pytest.raises(JobFailed) as caught:
        run_job(gather_without_rank_one, 1.0, 2, None, RunContext())
    silent = [f for f in caught.value.failures if f.cause == "did not answer"]
    assert [f.rank for f in silent] == [1], caught.value.failures
    assert "all_gather of the test's objects" in silent[0].message
    assert "1000" in silent[0].message and "10000" not in silent[0].message


def test_world_from_env_reads_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29501"}
    world = world_from_env(env)
    assert world is not None
    assert (world.rank, world.world_size, world.local_rank, world.node_rank) == (3, 8, 1, 1)
    assert world_from_env({}) is None


def test_n_gpus_is_refused_below_one_or_against_the_launchers_world_of_the_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = RunContext(launcher_env={"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="disagrees"):
        resolve_nproc(4, 2, ctx)
    assert resolve_nproc(None, 7, ctx) == 2
    with pytest.raises(UsageError):
        resolve_nproc(0, 2, RunContext())
    # `all --local` gives its commands an environment without the launcher's variables:
    # what the process itself has set does not count.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_nproc(4, 2, RunContext(launcher_env={})) == 4


AGENT = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
         "TORCHELASTIC_USE_AGENT_STORE": "True"}


def test_a_rank_is_a_client_of_the_agents_store_only_where_and_at_what_torchrun_says(
        ) -> None:
    assert _world(AGENT).agent_store
    assert not _world({**AGENT, "TORCHELASTIC_USE_AGENT_STORE": "False"}).agent_store
    assert not _world({k: v for k, v in AGENT.items()
                       if k != "TORCHELASTIC_USE_AGENT_STORE"}).agent_store
    assert not agent_serves_store(AGENT, "10.0.0.2", 29400)
    assert not agent_serves_store(AGENT, "10.0.0.1", 29401)
    assert agent_serves_store(AGENT, "10.0.0.1", 29400)


def _world(env: dict[str, str]) -> World:
    world = world_from_env(env)
    assert world is not None
    return world


@dataclass
class _OlderLaunchConfig:
    """LaunchConfig as torch 2.11 has it: no shutdown_timeout."""

    nproc_per_node: int
    signals_to_handle: str = "SIGTERM"


@dataclass
class _NewerLaunchConfig(_OlderLaunchConfig):
    shutdown_timeout: int | None = None


def test_a_launch_setting_this_torch_lacks_is_left_to_its_default() -> None:
    older = _launch_config(_OlderLaunchConfig, nproc_per_node=2, shutdown_timeout=3)
    assert older == _OlderLaunchConfig(nproc_per_node=2)
    newer = _launch_config(_NewerLaunchConfig, nproc_per_node=2, shutdown_timeout=3)
    assert newer.shutdown_timeout == 3


def test_any_other_unknown_launch_setting_is_still_an_error() -> None:
    with pytest.raises(TypeError):
        _launch_config(_OlderLaunchConfig, nproc_per_node=2, typo_timeout=3)
