"""The recipes of docs/preflight.md, run as far as this machine allows: the sbatch
script against stand-in srun, scontrol and sbatch (preflight, exclude, resubmit once),
the torchrun wrapper for real on 2 CPU ranks, the post-repair gate against a stand-in
scontrol, and the Kubernetes and PyTorchJob command lines through gpucheck's parser."""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from comm_workers import clean_env, free_port, tracked, wait_gone
from test_preflight_runs import SUITE_SETTINGS, _trained

from gpucheck import cli

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "docs" / "preflight"
RUN_S = 300
TRAIN = 'import os\nprint("TRAIN", os.environ.get("PREFLIGHT_RESUBMITTED"), flush=True)\n'


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def site(tmp_path: Path) -> dict:
    """A PATH with gpucheck, python and torchrun (this repository, this interpreter),
    and stand-in srun (runs its command here, as one task), scontrol and sbatch that
    append their arguments to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = shlex.quote(sys.executable)
    # gpucheck through tests/hooked.py: HOOKED_OPTIONS (this stand-in's, word-split) are
    # its test hooks, which reach every rank as data (gpucheck reads no such variable).
    hooked = shlex.quote(str(REPO / "tests" / "hooked.py"))
    _script(bin_dir / "gpucheck", f'exec {python} {hooked} $HOOKED_OPTIONS gpucheck "$@"\n')
    _script(bin_dir / "python", f'exec {python} "$@"\n')
    _script(bin_dir / "torchrun", f'exec {python} -m torch.distributed.run "$@"\n')
    log = tmp_path / "calls.log"
    for tool in ("scontrol", "sbatch"):
        _script(bin_dir / tool, f'printf "%s\\n" "{tool} $*" >> {shlex.quote(str(log))}\n'
                'case "$*" in "show hostnames"*) echo localhost;; '
                '"show job"*) echo "   Command=/jobs/train.sbatch";; '
                '"show node"*) echo "${FAKE_NODE:-}";; esac\n')
    _script(bin_dir / "srun", 'exec "$@"\n')
    (tmp_path / "train.py").write_text(TRAIN)
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="77")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'tests'}"
    return {"dir": tmp_path, "env": env, "log": log}


def _calls(site: dict, tool: str) -> list[str]:
    log = site["log"]
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith(f"{tool} ")]


def _sbatch(site: dict, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(RECIPES / "sbatch-preflight.sh"), "--lr", "3e-4"],
                          cwd=site["dir"], env=site["env"] | {"PREFLIGHT_BUDGET": "60", **env},
                          capture_output=True, text=True, timeout=RUN_S)


# A budget no check but the allocation fits (their costs, gpucheck.commands.preflight):
# a pass without --strict, in a moment; the recipes' flow is what these tests are for.
PASS_BUDGET = "1.5"


def test_the_recipes_are_valid_shell() -> None:
    for script in sorted(RECIPES.glob("*.sh")):
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_sbatch_recipe_starts_training_after_a_pass_and_submits_nothing(site: dict) -> None:
    done = _sbatch(site, PREFLIGHT_BUDGET=PASS_BUDGET)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRAIN None" in done.stdout
    assert (site["dir"] / "preflight-exclude.77").read_text() == ""
    assert _calls(site, "sbatch") == []


def test_sbatch_recipe_excludes_the_failing_host_and_resubmits_once(site: dict) -> None:
    from health_fakes import gpu_node_sysfs

    # The node fails its first check: 8 GPUs on its PCI bus, CPU ranks (a wrong product
    # on a rank: tests/test_preflight_runs.py); the NVML check's budget and a second.
    done = _sbatch(site, PREFLIGHT_BUDGET="3",
                   GPUCHECK_SYSFS=str(gpu_node_sysfs(site["dir"] / "sys")))
    assert done.returncode == 1 and "TRAIN" not in done.stdout, done.stderr[-3000:]
    host = socket.gethostname()
    assert _calls(site, "sbatch") == [f"sbatch --exclude={host} --export=ALL,"
                                      "PREFLIGHT_RESUBMITTED=1 /jobs/train.sbatch --lr 3e-4"]
    report = json.loads((site["dir"] / "preflight-77.json").read_text())
    assert report["sections"][0]["data"]["failing_nodes"][0]["checks"] == ["gpu.count"]


def test_sbatch_recipe_does_not_resubmit_a_resubmitted_job(site: dict) -> None:
    # A stand-in srun that fails as preflight does, naming a host in the exclude file.
    _script(site["dir"] / "bin" / "srun",
            'while [ "$1" != --exclude-file ]; do shift; done; echo gpu-b > "$2"; exit 1\n')
    done = _sbatch(site, PREFLIGHT_RESUBMITTED="1")
    assert done.returncode == 1
    assert _calls(site, "sbatch") == []


def test_torchrun_wrapper_runs_the_command_on_every_rank(site: dict) -> None:
    """Checks past the budget are skipped (no --strict): a pass, and the processes
    torchrun started become the command (its children, same pids), with no variable of
    gpucheck's own."""
    env = site["env"] | {"NPROC_PER_NODE": "2", "PREFLIGHT_BUDGET": PASS_BUDGET,
                         "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    env = {k: v for k, v in env.items()
           if not k.startswith("GPUCHECK_") or k in SUITE_SETTINGS}
    proc = subprocess.Popen([str(RECIPES / "torchrun-preflight.sh"), "python",
                             str(REPO / "tests" / "preflight_train.py")], cwd=site["dir"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    with tracked([proc]) as seen:
        stdout, stderr = proc.communicate(timeout=RUN_S)
        assert wait_gone(seen) == []
    assert proc.returncode == 0, stderr[-3000:]
    trained = _trained(stdout)
    assert [(r["rank"], r["sum"], r["ppid"]) for r in trained] == [
        (0, 3.0, proc.pid), (1, 3.0, proc.pid)]
    assert all(set(r["gpucheck_vars"]) <= set(SUITE_SETTINGS)
               and r["nccl_blocking_wait"] is None for r in trained)
    assert (site["dir"] / "preflight-exclude.txt").read_text() == ""


def test_post_repair_gate_resumes_a_healthy_node(site: dict) -> None:
    done = subprocess.run(["sh", str(RECIPES / "post-repair-gate.sh"),
                           str(site["dir"] / "reports")], env=site["env"],
                          capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert _calls(site, "scontrol update") == [f"scontrol update NodeName={node} State=RESUME"]


@pytest.mark.parametrize("told_by", ["pci_bus", "slurm_gres"])
def test_post_repair_gate_keeps_a_gpu_node_on_cpu_ranks_drained(site: dict,
                                                                told_by: str) -> None:
    """A GPU node whose driver did not load falls back to CPU ranks: never a pass that
    resumes it (issue 34, item 2). Its 8 GPUs are on the (fake) PCI bus, or in the GRES
    slurm.conf gives the node (a dead GPU may not even show on the bus)."""
    from health_fakes import gpu_node_sysfs

    # The NVML check's 2 s and a second to spare: the checks after it do not fit (the
    # GEMM's 2.2 s may), and under --strict each is a FAIL (preflight.budget) too.
    env = {**site["env"], "PREFLIGHT_BUDGET": "3"}
    env |= {"GPUCHECK_SYSFS": str(gpu_node_sysfs(site["dir"] / "sys"))} \
        if told_by == "pci_bus" else {"FAKE_NODE": "   Gres=gpu:h100:8(S:0-1) NodeAddr=gpu-7"}
    done = subprocess.run(["sh", str(RECIPES / "post-repair-gate.sh"),
                           str(site["dir"] / "reports")], env=env,
                          capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 1, done.stderr[-3000:] + done.stdout[-3000:]
    assert not [c for c in _calls(site, "scontrol") if "RESUME" in c]
    (report,) = (site["dir"] / "reports").glob("repair-*.json")
    failed = {f["check"] for s in json.loads(report.read_text())["sections"]
              for f in s["findings"] if f["status"] == "FAIL"}
    assert {"gpu.count", "preflight.budget"} <= failed


def _gpucheck_args(command: list[str]) -> list[str]:
    return command[command.index("gpucheck") + 1:]


@pytest.mark.parametrize(("name", "path"), [
    ("k8s-init-container.yaml", ["spec", "initContainers", 0, "command"]),
    ("pytorchjob.yaml", ["spec", "pytorchReplicaSpecs", "Worker", "template", "spec",
                         "containers", 0, "command"])])
def test_kubernetes_command_lines_parse_as_gpucheck_preflight(name: str, path: list) -> None:
    node = yaml.safe_load((RECIPES / name).read_text())
    for key in path:
        node = node[key]
    args = cli.build_parser().parse_args(_gpucheck_args([str(a) for a in node]))
    assert args.command == "preflight" and args.budget == 60.0
    if name == "pytorchjob.yaml":
        assert args.job_command == ["--", "python", "train.py", "--lr", "3e-4"]
