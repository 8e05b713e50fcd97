"""A node with fewer usable GPUs than it should have FAILs (issue 34, item 2): the count
it should have comes from --expect-gpus, SLURM's GRES, the container's GPUs, else the
NVIDIA GPUs on the PCI bus (a fake sysfs here); `health`, `env` (so `all`), preflight
and `all`'s CPU fallback all judge against it. CPU ranks are for a laptop only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucheck.cli import main
from gpucheck.commands import all as all_cmd
from gpucheck.devices import EXPECT_VAR, SYSFS_VAR, expected_gpus
from gpucheck.health.run import HealthOptions, collect_health_report
from gpucheck.preflight.worker import nvml_findings
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.health_fakes import gpu_node_sysfs


@pytest.mark.parametrize(("environ", "option", "count"), [
    ({}, None, 8),
    ({}, 6, 6),
    ({"SLURM_GPUS_ON_NODE": "2"}, None, 2),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-a, GPU-b,GPU-c"}, None, 3),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, None, 8),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, None, 0),
    ({"NVIDIA_VISIBLE_DEVICES": "MIG-a,MIG-b"}, None, 1),
    ({"SLURM_GPUS_ON_NODE": "a lot"}, None, 8),
    ({"GPUCHECK_EXPECT_GPUS": "4", "SLURM_GPUS_ON_NODE": "2"}, None, 4),
])
def test_the_expected_count_comes_from_the_option_gres_container_or_pci_bus(
        tmp_path: Path, environ: dict[str, str], option: int | None, count: int) -> None:
    assert expected_gpus(environ, gpu_node_sysfs(tmp_path), option).count == count


def _health(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeNvml,
            gpus_on_bus: int) -> Report:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    options = HealthOptions(budget_s=20, kernel_log=str(_clean_log(tmp_path)),
                            sysfs=gpu_node_sysfs(tmp_path / "sys", gpus_on_bus),
                            proc=tmp_path / "proc")
    return collect_health_report(options)


def _clean_log(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "dmesg.txt"
    log.write_text("[    0.000000] Linux version 6.8.0\n")
    return log


def _count(report: Report) -> list[tuple[Status, str | None]]:
    return [(f.status, f.action) for f in report.findings if f.check == "gpu.count"]


@pytest.mark.parametrize(("seen", "verdict"), [(7, [(Status.FAIL, "drain-node")]),
                                               (8, [(Status.OK, None)])])
def test_health_fails_a_node_whose_nvml_shows_fewer_gpus_than_its_pci_bus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: int, verdict: list) -> None:
    report = _health(tmp_path, monkeypatch, FakeNvml([FakeGpu()] * seen), 8)
    assert _count(report) == verdict


def test_health_fails_a_gpu_node_whose_driver_did_not_load_and_skips_a_laptop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_driver = FakeNvml([], init_error="NVMLError_LibraryNotFound")
    assert _count(_health(tmp_path / "gpu", monkeypatch, no_driver, 8)) == [
        (Status.FAIL, "drain-node")]
    laptop = _health(tmp_path / "laptop", monkeypatch, no_driver, 0)
    assert _count(laptop) == [] and laptop.verdict() is not Status.FAIL


def test_env_fails_a_gpu_the_bus_has_and_nvml_does_not_show(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu()] * 3).module)
    result = probe_nvml(Nvml(2.0), gpu_node_sysfs(tmp_path, 4), {})
    (count,) = [f for s in result.sections for f in s.findings if f.check == "gpu.count"]
    assert (count.status, count.action) == (Status.FAIL, "drain-node")


def _gpu_findings(environ: dict[str, str]) -> list[tuple[str, str]]:
    return [(f["check"], f["status"]) for f in nvml_findings("cpu", environ=environ)
            if not f["check"].startswith("kernel_log")]


def test_preflight_on_cpu_ranks_fails_a_node_that_should_have_gpus(tmp_path: Path) -> None:
    assert _gpu_findings({SYSFS_VAR: str(gpu_node_sysfs(tmp_path))}) == [("gpu.count", "FAIL")]
    laptop = {SYSFS_VAR: str(tmp_path / "laptop")}
    assert _gpu_findings(laptop) == [("preflight.nvml", "SKIP")]
    assert _gpu_findings({**laptop, EXPECT_VAR: "4"}) == [("gpu.count", "FAIL")]
    asked = nvml_findings("cpu", environ={**laptop, EXPECT_VAR: "4"}, cpu_asked=True)
    assert [f["status"] for f in asked if f["check"] == "gpu.count"] == ["SKIP"]


def test_all_on_cpu_ranks_fails_a_node_that_should_have_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = Report(command="comm")
    monkeypatch.setattr(all_cmd, "_run_one",
                        lambda name, ns, ctx: all_cmd.Outcome(name, "ran", "", 0.1, ran))
    gpus, laptop = gpu_node_sysfs(tmp_path / "gpu"), tmp_path / "laptop"
    for sysfs, device, counted in ((gpus, [], ["FAIL"]), (laptop, [], []),
                                   (gpus, ["--device", "cpu"], ["SKIP"])):
        monkeypatch.setenv(SYSFS_VAR, str(sysfs))
        out = tmp_path / "all.json"
        code = main(["all", "--skip", "env,stress,bench", *device, "-q", "-o", str(out)])
        summary = json.loads(out.read_text())["sections"][0]
        assert [f["status"] for f in summary["findings"] if f["check"] == "gpu.count"] == (
            counted) and code == int(counted == ["FAIL"])
