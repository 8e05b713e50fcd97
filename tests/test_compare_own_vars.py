"""gpucheck's own variables (GPUCHECK_PROGRESS: 1 at a terminal, 0 under cron or a pipe)
are no fact about the machine: never reported, never compared, never drift (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucheck.cli import main
from gpucheck.probes.system import allowed_env, probe_envvars

REPORTS = Path(__file__).resolve().parent / "data" / "reports"


def env_report(folder: Path, name: str, host: str, progress: str) -> Path:
    """The sample GPU env report as a report from before gpucheck left out its own
    variables: GPUCHECK_PROGRESS among the machine's environment."""
    raw = json.loads((REPORTS / "env_gpu.json").read_text())
    raw["host"] = host
    for section in raw["sections"]:
        if section["name"] == "environment":
            section["data"]["variables"]["GPUCHECK_PROGRESS"] = progress
    out = folder / name
    out.write_text(json.dumps(raw))
    return out


def checks(report: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(f["check"], f["status"], f.get("subject")) for s in report["sections"]
            for f in s["findings"]]


def test_gpucheck_own_variables_are_never_reported_as_the_environment() -> None:
    environ = {"GPUCHECK_PROGRESS": "1", "GPUCHECK_RUN_DIR": "/tmp/x",
               "CUDA_VISIBLE_DEVICES": "0,1"}
    assert allowed_env(environ) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert probe_envvars(environ).data == {"variables": {"CUDA_VISIBLE_DEVICES": "0,1"}}


def test_a_terminal_run_and_a_cron_run_compare_without_an_environment_warning(
        tmp_path: Path) -> None:
    a = env_report(tmp_path, "a.json", "gpu01", "0")
    b = env_report(tmp_path, "b.json", "gpu01", "1")
    out = tmp_path / "compare.json"
    assert main(["compare", str(a), str(b), "-q", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    assert not [c for c in checks(report) if c[0] == "compare.environment"
                and c[1] != "OK"]
    assert "GPUCHECK_PROGRESS" not in out.read_text()


def test_the_node_checked_by_hand_is_no_drift_in_the_fleet(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(1, 5):
        env_report(folder, f"n{i}.json", f"gpu{i:02d}", "0")
    env_report(folder, "n5.json", "gpu05", "1")  # run at a terminal
    out = tmp_path / "fleet.json"
    main(["fleet", str(folder), "-q", "-o", str(out)])
    report = json.loads(out.read_text())
    assert not [c for c in checks(report) if c[0] == "fleet.drift" and c[1] != "OK"]
    assert "GPUCHECK_PROGRESS" not in out.read_text()
