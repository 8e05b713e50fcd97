"""`gpucheck health` end to end on fake NVML: never imports torch, keeps its budget
when NVML hangs, and exits as each convention (slurm, npd, nagios) reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.health_fakes import healthy_ib_node, write_log

REPO = Path(__file__).resolve().parents[1]
FAKE_SITE = REPO / "tests" / "fake_nvml_site"


def _gpus(n: int, **faults: dict) -> list[FakeGpu]:
    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(n)]
    for key, changes in faults.items():
        for attr, value in changes.items():
            setattr(gpus[int(key[3:])], attr, value)
    return gpus


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node's fake sysfs (4 active NDR rails) and an empty kernel log."""
    healthy_ib_node(tmp_path / "sys")
    write_log(tmp_path / "dmesg.txt", [])
    return tmp_path


def _argv(node: Path, *extra: str) -> list[str]:
    return ["health", "--sysfs", str(node / "sys"), "--kernel-log", str(node / "dmesg.txt"),
            *extra]


def _main(monkeypatch, capsys, fake: FakeNvml, argv: list[str]) -> tuple[int, str, str]:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_in_a_fresh_interpreter_where_torch_cannot_import_health_runs_and_never_tries(node):
    """A sitecustomize makes every `import torch` raise and leaves a mark: a broken
    torch changes nothing, and health never even tries."""
    blockdir = node / "block"
    blockdir.mkdir()
    mark = node / "torch-was-imported"
    (blockdir / "sitecustomize.py").write_text(
        "import importlib.abc, pathlib, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        f"            pathlib.Path({str(mark)!r}).write_text(name)\n"
        "            raise ImportError('torch is broken here')\n"
        "sys.meta_path.insert(0, Block())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (blockdir, REPO, FAKE_SITE))),
           "GPUCHECK_FAKE_NVML": '{"gpus": [{}, {}]}'}
    # Nor any third-party module but pynvml: an image for node-problem-detector needs
    # gpucheck and nvidia-ml-py only.
    code = ("import sys; from gpucheck.cli import main; rc = main(sys.argv[1:]); "
            "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
            " - {'gpucheck', 'tests', '__main__', 'sitecustomize'} - {m for m in sys.modules "
            "if 'editable' in m or 'distutils' in m}), file=sys.stderr); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, *_argv(node, "--format", "line")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpucheck health OK: ") and not mark.exists()
    assert done.stderr.strip().splitlines()[-1] == "['pynvml']", done.stderr


def test_a_hung_nvml_call_ends_at_the_budget_as_a_skip_naming_the_gpu(node, monkeypatch,
                                                                        capsys):
    # The hung call blocks until released (at most 10 minutes): gpucheck must return
    # while it is still blocked, whatever this machine's speed.
    fake = FakeNvml(_gpus(4, gpu2={"hang": {"nvmlDeviceGetTotalEccErrors"}}), hang_s=600.0)
    try:
        code, out, _ = _main(monkeypatch, capsys, fake, _argv(
            node, "--budget", "1", "--nvml-timeout", "10", "--format", "json"))
        assert fake.hangs == 1 and fake.hangs_ended == 0  # it did not wait for the call
    finally:
        fake.release()
    report = Report.from_dict(json.loads(out))
    skipped = {f.subject.label: f.message for f in report.findings
               if f.check == "gpu.query" and f.subject is not None}
    assert "while reading this GPU" in skipped["GPU 2"] and "1 s budget" in skipped["GPU 2"]
    assert "not read" in skipped["GPU 3"]
    assert all(f.status is Status.SKIP for f in report.findings if f.check == "gpu.query")
    assert any(f.subject and f.subject.label.startswith("GPU 1 (") for f in report.findings)
    assert report.section("health").data["unfinished"] == ["gpus"]
    assert code == 0  # slurm: an unknown never drains


def test_an_nvml_call_answering_after_the_nvml_timeout_is_slow_not_hung(node, monkeypatch,
                                                                        capsys):
    fake = FakeNvml(_gpus(2, gpu1={"hang": {"nvmlDeviceGetTotalEccErrors"}}), hang_s=1.0)
    code, out, _ = _main(monkeypatch, capsys, fake, _argv(
        node, "--budget", "10", "--nvml-timeout", "0.3", "--format", "line"))
    assert code == 0 and out.startswith("gpucheck health WARN none: driver.nvml_slow: ")
    assert "nvmlDeviceGetTotalEccErrors answered after" in out


SCENARIOS = {
    "healthy": {},
    "warn": {"gpu3": {"pcie_width": (8, 16)}},
    "fail": {"gpu5": {"ecc_volatile_unc": 2}},
    "unknown": {"gpu1": {"hang": {"nvmlDeviceGetTotalEccErrors"}}},
}
EXPECTED = {  # (slurm, npd, nagios, slurm --strict)
    "healthy": (0, 0, 0, 0), "warn": (0, 0, 1, 1), "fail": (1, 1, 2, 1),
    "unknown": (0, 2, 3, 0),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_convention_reads_the_exit_code_right(scenario, node, monkeypatch, capsys):
    codes, lines = [], []
    for extra in (["--convention", "slurm"], ["--convention", "npd"],
                  ["--convention", "nagios"], ["--strict"]):
        fake = FakeNvml(_gpus(8, **SCENARIOS[scenario]), hang_s=10.0)
        code, out, _ = _main(monkeypatch, capsys, fake, _argv(
            node, "--budget", "1" if scenario == "unknown" else "20", "--nvml-timeout", "30",
            "--format", "line", *extra))
        codes.append(code)
        lines.append(out)
    assert tuple(codes) == EXPECTED[scenario]
    if scenario == "unknown":  # the line of a run cut short by the budget says so first
        assert lines[0].startswith("gpucheck health OK (gpus not finished within the "
                                   "1 s budget (an unknown, not an all-clear)): ")


def test_the_line_names_the_worst_problem_its_gpu_and_its_action(node, monkeypatch, capsys):
    fake = FakeNvml(_gpus(8, gpu3={"pcie_width": (8, 16)}, gpu5={"ecc_volatile_unc": 2}))
    code, out, _ = _main(monkeypatch, capsys, fake, _argv(node, "--format", "line"))
    assert code == 1 and out.count("\n") == 1 and out.endswith("\n")
    assert out.startswith("gpucheck health FAIL drain-node (+1 more): GPU 5 (bus "
                          "00000000:68:00.0): gpu.ecc.volatile_uncorrected: 2 uncorrected")


@pytest.mark.parametrize(("extra", "says"), [
    (["--consumer", "a/b"], "--consumer 'a/b': give a short name"),
    (["--set-healthy"], "--set-healthy needs --state-dir"),
    (["--sysfs", "/nonexistent/sys"], "--sysfs /nonexistent/sys is not a directory"),
])
def test_bad_options_are_one_line_usage_errors(extra, says, node, monkeypatch, capsys):
    code, out, err = _main(monkeypatch, capsys, FakeNvml(_gpus(1)), _argv(node, *extra))
    assert code == 2 and out == "" and says in err and err.count("\n") == 1


def test_a_state_dir_that_is_a_file_is_a_usage_error(node, monkeypatch, capsys):
    (node / "afile").write_text("x")
    code, _, err = _main(monkeypatch, capsys, FakeNvml(_gpus(1)),
                         _argv(node, "--state-dir", str(node / "afile")))
    assert code == 2 and "is not a directory" in err


def test_a_missing_state_dir_is_created(node, monkeypatch, capsys):
    code, _, _ = _main(monkeypatch, capsys, FakeNvml(_gpus(1)),
                       _argv(node, "--state-dir", str(node / "var/gpucheck"), "-q"))
    assert code == 0 and (node / "var/gpucheck/health-state.json").is_file()


def test_too_few_gpus_for_the_node_fails_and_says_how_many(node, monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, FakeNvml(_gpus(7)),
                         _argv(node, "--expect-gpus", "8", "--format", "line"))
    assert code == 1 and "FAIL drain-node: gpu.count: NVML sees 7 GPU(s), 8 expected" in out


def test_a_busy_gpu_is_not_a_health_problem(node, monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, FakeNvml(_gpus(2, gpu0={"pids": [4242]})),
                         _argv(node, "--format", "line"))
    assert code == 0 and out.startswith("gpucheck health OK")


def test_a_named_command_builds_only_its_own_parser():
    parser = cli.build_parser(["health", "--budget", "2"])
    sub = next(a for a in parser._actions if a.dest == "command")
    assert tuple(sub.choices) == ("health",)
    assert parser.parse_args(["health", "--budget", "2"]).budget == 2.0


def test_a_gpu_gone_since_an_earlier_check_fails_without_expect_gpus(node, monkeypatch,
                                                                    capsys):
    state = ["--state-dir", str(node / "state"), "--format", "line"]
    assert _main(monkeypatch, capsys, FakeNvml(_gpus(8)), _argv(node, *state))[0] == 0
    for _ in range(2):  # and it stays until the GPU is back
        code, out, _ = _main(monkeypatch, capsys, FakeNvml(_gpus(7)), _argv(node, *state))
        assert code == 1 and "gpu.count: NVML sees 7 GPU(s), 8 at an earlier check" in out
    code, out, _ = _main(monkeypatch, capsys, FakeNvml(_gpus(7)),
                         _argv(node, *state, "--expect-gpus", "7"))
    assert code == 0, out
