"""`gpucheck preflight -- CMD` for real: 2 gloo ranks on 127.0.0.1, under torchrun and
as srun starts them (each rank a process with RANK, WORLD_SIZE, ..., SLURM_*, no agent).
A pass: every rank's own process becomes CMD, whose own init_process_group(env://) and
all_reduce work. A fault: CMD starts on no rank, the report names the rank, the exclude
file its host. Alone (no launcher, every check, a pass), and checks past the budget
(skipped; with --strict a stop): tests/test_preflight_recipes.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest
from comm_workers import PYTHON, ROOT, clean_env, descendants, free_port, start, tracked, wait_gone

RUN_S = 300
# The stopped-rank runs: enough for the CPU GEMM check to start (its cost 2.2 s,
# gpucheck.commands.preflight.DEFAULTS) after the NVML check, on a loaded machine; the
# survivor's wait ends at the budget's end plus GRACE_S, so a shorter one ends sooner.
STOPPED_BUDGET = "5"
TRAIN = str(ROOT / "tests" / "preflight_train.py")
HOOKED = str(ROOT / "tests" / "hooked.py")  # gpucheck with planted faults (tests/plant.py)
HOOK_PATH = f"{ROOT}:{ROOT / 'tests'}"


# The suite's own settings (tests/conftest.py: the kernel log and sysfs the tests provide).
SUITE_SETTINGS = ("GPUCHECK_KERNEL_LOG", "GPUCHECK_SYSFS")


def _env(**extra: str) -> dict[str, str]:
    """The test's environment with tests/ importable (the hooks' modules), without any
    GPUCHECK_* variable but the suite's own (an earlier test's cli.main may have set one
    in this process), so whatever else the command finds of them, gpucheck left behind."""
    env = {k: v for k, v in clean_env(**extra).items()
           if not k.startswith("GPUCHECK_") or k in extra or k in SUITE_SETTINGS}
    return env | {"PYTHONPATH": HOOK_PATH}


def _trained(stdout: str) -> list[dict]:
    """Every `TRAIN {...}` the ranks printed: ranks under torchrun share one pipe, so
    two writes may land on one line; each is read where it starts."""
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(stdout, match.end())[0]
             for match in re.finditer(r"TRAIN ", stdout)]
    return sorted(found, key=lambda r: r["rank"])


def _torchrun(tmp_path: Path, *options: str, hooks: tuple[str, ...] = (),
              **env: str) -> subprocess.Popen[str]:
    """`hooks`: tests/hooked.py's options (every rank plants them)."""
    args = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--max-restarts", "0", HOOKED, *hooks, "gpucheck", "preflight", *options,
            "--", PYTHON, TRAIN]
    return start(args, _env(**env))


def _slurm_ranks(port: int, *options: str, nodes: int = 1, hooks: tuple[str, ...] = (),
                 **env: str) -> list[subprocess.Popen[str]]:
    """Two tasks as srun starts them: no agent, rank 0 hosts the store; with `nodes=2`
    each task is its own "node" (node rank 0 and 1 on this one host)."""
    procs = []
    for rank in (0, 1):
        node, local = (rank, 0) if nodes == 2 else (0, rank)
        rank_env = _env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(local),
            LOCAL_WORLD_SIZE=str(2 // nodes), GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port), SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(local), SLURM_NODEID=str(node),
            SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_NNODES=str(nodes),
            SLURM_JOB_NODELIST="localhost", SLURM_STEP_NODELIST="localhost",
            SLURM_TASKS_PER_NODE=str(2 // nodes), **env)
        procs.append(start([PYTHON, HOOKED, *hooks, "gpucheck", "preflight", *options, "--",
                            PYTHON, TRAIN], rank_env))
    return procs


def test_two_nodes_measure_their_links_then_run_the_command_on_master_port(
        tmp_path: Path) -> None:
    """srun's shape, each task its own node: the links are measured, every -o written,
    then each task's own process becomes the command, with MASTER_PORT free for its
    process group; no rank prints c10d's C++ noise as rank 0's store goes."""
    report, markdown, port = tmp_path / "report.json", tmp_path / "report.md", free_port()
    procs = _slurm_ranks(port, "-q", "-o", str(report), "-o", str(markdown), nodes=2)
    with tracked(procs):
        outs = [p.communicate(timeout=RUN_S) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert markdown.read_text().startswith("# gpucheck preflight")
    assert all("recvValue" not in err for _, err in outs)
    trained = [_trained(out)[0] for out, _ in outs]
    assert [(r["rank"], r["sum"]) for r in trained] == [(0, 3.0), (1, 3.0)]
    assert [r["pid"] for r in trained] == [p.pid for p in procs]
    assert {r["master_port"] for r in trained} == {str(port)}
    sections = {s["name"]: s for s in json.loads(report.read_text())["sections"]}
    assert sections["budget"]["data"]["checks"]["links"] == "done"
    assert [(f["check"], f["status"]) for f in sections["internode"]["findings"]] == [
        ("comm.internode.slow_pair", "OK")]


@pytest.mark.parametrize("launch", ["torchrun", "slurm"])
def test_wrong_matmul_on_rank_one_starts_the_command_nowhere(tmp_path: Path,
                                                            launch: str) -> None:
    """Under srun the node is named by SLURM's node name (drain and exclude file), which
    may differ from the kernel's host name."""
    exclude, report = tmp_path / "exclude.txt", tmp_path / "report.json"
    options = ("-q", "-o", str(report), "--exclude-file", str(exclude))
    hooks = ("--stress", "stress_workers:wrong_rank_one_always")
    procs = [_torchrun(tmp_path, *options, hooks=hooks)] if launch == "torchrun" else \
        _slurm_ranks(free_port(), *options, hooks=hooks, SLURMD_NODENAME="gpu-node-017")
    host = socket.gethostname() if launch == "torchrun" else "gpu-node-017"
    with tracked(procs) as seen:
        outs = [p.communicate(timeout=RUN_S) for p in procs]
        assert wait_gone(seen) == []
    assert all(p.returncode == 1 for p in procs), [e[-2000:] for _, e in outs]
    assert all(_trained(out) == [] for out, _ in outs)
    head = json.loads(report.read_text())["sections"][0]
    assert head["name"] == "preflight" and head["data"]["go"] is False
    [node] = head["data"]["failing_nodes"]
    assert node["ranks"] == [1] and node["host"] == host
    assert "preflight.sdc" in node["checks"]
    assert [f["subject"] for f in head["findings"] if f["status"] == "FAIL"] == [host]
    assert exclude.read_text() == f"{host}\n"
    assert f"NodeName={host}" in outs[0][1]


def test_rank_zero_stopped_still_stops_the_command_and_rank_one_speaks(
        tmp_path: Path) -> None:
    """Rank 0 (the reporter) stops (SIGSTOP) mid-check: rank 1 refuses the command, exits
    1, and writes the report and the exclude file naming rank 0's host; bounded, no
    process left."""
    exclude, report = tmp_path / "exclude.txt", tmp_path / "report.json"
    proc = _torchrun(tmp_path, "-q", "--budget", STOPPED_BUDGET, "-o", str(report),
                     "--exclude-file", str(exclude),
                     hooks=("--stress", "preflight_workers:stop_rank_zero"))
    with tracked([proc]) as seen:
        stdout, stderr = proc.communicate(timeout=RUN_S)
        assert wait_gone(seen) == []
    assert proc.returncode == 1 and _trained(stdout) == [], stderr[-3000:]
    assert "exitcode  : 1 (pid" in stderr  # rank 1 ended itself, with 1
    failed = [f for s in json.loads(report.read_text())["sections"] for f in s["findings"]
              if f["status"] == "FAIL"]
    assert [(f["check"], f["subject"]) for f in failed] == [
        ("preflight.rank_unresponsive", "rank 0")]
    assert exclude.read_text() == f"{socket.gethostname()}\n"


def test_rank_zero_stopped_under_srun_shape_rank_one_ends_and_names_it(
        tmp_path: Path) -> None:
    """srun's shape: rank 0's process hosts the job's store, so with rank 0 stopped a
    store call on rank 1 cannot return; the hang guard ends rank 1 (exit 1, the
    command not started) and it writes rank 0's host to the exclude file."""
    exclude = tmp_path / "exclude.txt"
    procs = _slurm_ranks(free_port(), "-q", "--budget", STOPPED_BUDGET, "--exclude-file",
                         str(exclude), hooks=("--stress", "preflight_workers:stop_rank_zero",
                                "--hang-margin", "0"))
    with tracked(procs) as seen:
        _stdout, stderr = procs[1].communicate(timeout=RUN_S)
        seen.extend(p.pid for p in descendants(procs[1]))
        assert procs[1].returncode == 1, stderr[-3000:]
        assert wait_gone([procs[1].pid, *seen]) == []
    assert _trained(_stdout) == []
    assert exclude.read_text() == f"{socket.gethostname()}\n"
