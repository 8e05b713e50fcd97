"""The rank environment derived from SLURM's variables (srun without torchrun)."""

from __future__ import annotations

import pytest

from gpucheck.distributed.world import expand_nodelist, master_port, tasks_per_node, world_from_env
from gpucheck.errors import UsageError

SRUN = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_JOB_ID": "123456"}


@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("node007", ["node007"]),
    ("dgx[098-100]-ib", ["dgx098-ib", "dgx099-ib", "dgx100-ib"]),
])
def test_expand_nodelist_keeps_zero_padding(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_tasks_per_node_reads_repeat_counts() -> None:
    assert tasks_per_node("4(x2),3") == [4, 4, 3]
    assert tasks_per_node("8") == [8]


def test_world_comes_from_slurm_when_torchrun_variables_are_absent() -> None:
    world = world_from_env(SRUN)
    assert world is not None and world.launcher == "slurm"
    assert (world.rank, world.world_size, world.local_rank) == (5, 8, 1)
    assert (world.node_rank, world.local_world_size) == (1, 4)
    assert world.master_addr == "gpu01"
    assert world.master_port == master_port(SRUN) == 20000 + 123456 % 20000


def test_torchrun_variables_win_over_slurm() -> None:
    env = SRUN | {"RANK": "0", "WORLD_SIZE": "2"}
    world = world_from_env(env)
    assert world is not None and world.launcher == "torchrun"


def test_master_addr_and_port_when_set_win() -> None:
    world = world_from_env(SRUN | {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1234"})
    assert world is not None and (world.master_addr, world.master_port) == ("10.0.0.9", 1234)


@pytest.mark.parametrize(("env", "named"), [
    ({k: v for k, v in SRUN.items() if k != "SLURM_JOB_NODELIST"}, "set MASTER_ADDR"),
    (SRUN | {"SLURM_JOB_NODELIST": "gpu[01-02]x[1-2]"}, "set MASTER_ADDR"),
    (SRUN | {"SLURM_PROCID": "abc"}, "SLURM_PROCID"),
])
def test_a_missing_or_unreadable_variable_is_an_error_naming_the_fix(
        env: dict[str, str], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        world_from_env(env)


def test_no_launcher_variables_means_no_world() -> None:
    assert world_from_env({"SLURM_JOB_ID": "1"}) is None
