"""The recipes of docs/health.md, run: the SLURM wrappers against a fake `scontrol` and
`sinfo` recording their arguments, the node-problem-detector config as NPD validates
it, the DaemonSet, and the Prometheus textfile script and alert rules."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.render.headline import MAX_CHARS
from tests.health_fakes import healthy_ib_node, set_state, write_log, xid_line

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "docs" / "health"
FAKE_SITE = REPO / "tests" / "fake_nvml_site"
DBE = xid_line(100.5, "0000:18:00", 48,
               "An uncorrectable double bit error (DBE) has been detected.")


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def node(tmp_path: Path) -> dict:
    """A PATH with gpucheck (this repository, fake NVML), and fake scontrol and sinfo
    that append their arguments to calls.log; sinfo prints $FAKE_REASON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "gpucheck", f'exec {shlex.quote(sys.executable)} -m gpucheck "$@"\n')
    log = tmp_path / "calls.log"
    for tool in ("scontrol", "sinfo"):
        _script(bin_dir / tool, f'printf "%s\\n" "{tool} $*" >> {shlex.quote(str(log))}\n'
                + ('printf "%s\\n" "$FAKE_REASON"\n' if tool == "sinfo" else ""))
    healthy_ib_node(tmp_path / "sys")
    kernel_log = write_log(tmp_path / "dmesg.txt", [])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(map(str, (REPO, FAKE_SITE))),
           "GPUCHECK_FAKE_NVML": json.dumps({"gpus": [{}] * 8}), "GPUCHECK_NODE": "gpu-node-7",
           "GPUCHECK_STATE_DIR": str(tmp_path / "state"), "FAKE_REASON": "none",
           "GPUCHECK_HEALTH_ARGS": f"--sysfs {tmp_path / 'sys'} --kernel-log {kernel_log}"}
    return {"env": env, "calls": log, "dir": tmp_path, "kernel_log": kernel_log}


def _run(script: str, node: dict, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RECIPES / script)], env={**node["env"], **env}, text=True,
                          capture_output=True, timeout=120, check=False)


def _calls(node: dict) -> list[str]:
    return node["calls"].read_text().splitlines() if node["calls"].exists() else []


def _sick(node: dict) -> None:
    write_log(node["kernel_log"], [DBE])


def test_the_healthcheck_wrapper_leaves_a_healthy_node_alone(node):
    done = _run("slurm-healthcheck.sh", node)
    assert done.returncode == 0, done.stderr
    assert not [c for c in _calls(node) if c.startswith("scontrol")]


def test_the_healthcheck_wrapper_drains_with_the_one_line_reason(node):
    _sick(node)
    done = _run("slurm-healthcheck.sh", node)
    assert done.returncode == 0, done.stderr
    (call,) = [c for c in _calls(node) if c.startswith("scontrol")]
    assert call.startswith("scontrol update nodename=gpu-node-7 state=drain reason=gpucheck "
                           "health FAIL reset-gpu: GPU 0 (bus 00000000:18:00.0): "
                           "kernel_log.xid: XID 48")
    assert "\n" not in call


def test_the_healthcheck_wrapper_resumes_only_a_node_it_drained_itself(node):
    _run("slurm-healthcheck.sh", node, FAKE_REASON="gpucheck health FAIL reset-gpu: GPU 0")
    assert "scontrol update nodename=gpu-node-7 state=resume" in _calls(node)
    node["calls"].unlink()
    _run("slurm-healthcheck.sh", node, FAKE_REASON="replacing fan (alice)")
    assert not [c for c in _calls(node) if c.startswith("scontrol")]


def test_the_healthcheck_wrapper_changes_nothing_when_gpucheck_cannot_tell(node):
    done = _run("slurm-healthcheck.sh", node, GPUCHECK_HEALTH_ARGS="--budget 0",
                FAKE_REASON="gpucheck health FAIL reset-gpu: GPU 0")
    assert done.returncode == 0 and "could not judge gpu-node-7 (exit 2)" in done.stderr
    assert not [c for c in _calls(node) if c.startswith("scontrol")]


def test_the_prolog_passes_a_healthy_node_and_drains_a_sick_one_with_exit_1(node):
    assert _run("slurm-prolog.sh", node).returncode == 0 and _calls(node) == []
    _sick(node)
    done = _run("slurm-prolog.sh", node)
    (call,) = _calls(node)
    assert done.returncode == 1 and call.startswith(
        "scontrol update nodename=gpu-node-7 state=drain reason=gpucheck health FAIL")


def _set_healthy(node: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "gpucheck", "health", "--state-dir",
                           node["env"]["GPUCHECK_STATE_DIR"], "--set-healthy", "-q",
                           *node["env"]["GPUCHECK_HEALTH_ARGS"].split()],
                          env=node["env"], text=True, capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("damage", ["count", "version"])
def test_a_state_that_cannot_be_read_keeps_the_node_drained_until_it_is_cleared(node, damage):
    """A GPU to replace, remembered; one field of the file damaged (or written by a newer
    gpucheck): the recipe must not resume the node on a clean log (issue 34, item 4)."""
    write_log(node["kernel_log"], [xid_line(100.5, "0000:18:00", 64, "ECC page retirement "
                                            "or row remapper recording failure")])
    _run("slurm-healthcheck.sh", node)
    state = Path(node["env"]["GPUCHECK_STATE_DIR"]) / "health-state.json"
    data = json.loads(state.read_text())
    assert [f["action"] for f in data["faults"]] == ["replace-hardware"]
    if damage == "count":
        data["consumers"]["slurm-healthcheck"]["kernel_log"]["count"] = -1
    else:
        data["version"] = 3
    state.write_text(json.dumps(data))
    write_log(node["kernel_log"], [])  # the log rotated: nothing new in it
    node["calls"].unlink()
    drained = "gpucheck health FAIL replace-hardware: GPU 0"
    for _ in range(2):  # not once: every run until an administrator clears it
        _run("slurm-healthcheck.sh", node, FAKE_REASON=drained)
        (call,) = [c for c in _calls(node) if c.startswith("scontrol")]
        assert "state=drain" in call and "health.state" in call and "--set-healthy" in call
        node["calls"].unlink()
    _set_healthy(node)
    _run("slurm-healthcheck.sh", node, FAKE_REASON=drained)
    assert [c for c in _calls(node) if c.startswith("scontrol")] == [
        "scontrol update nodename=gpu-node-7 state=resume"]


def test_a_port_seen_active_by_the_prolog_is_down_for_the_health_check_too(node):
    """The health check saw a port INIT, the prolog saw it ACTIVE, then it went DOWN:
    both judge it from the node's one history (issue 34, item 5)."""
    sysfs = node["dir"] / "sys"
    set_state(sysfs, "mlx5_0", 1, state=2, phys=5)  # INIT: no subnet manager yet
    _run("slurm-healthcheck.sh", node)
    set_state(sysfs, "mlx5_0", 1, state=4, phys=5)
    assert _run("slurm-prolog.sh", node).returncode == 0
    set_state(sysfs, "mlx5_0", 1, state=1, phys=2)  # the cable pulled
    node["calls"].unlink(missing_ok=True)
    _run("slurm-healthcheck.sh", node, FAKE_REASON="gpucheck health FAIL drain-node: x")
    (call,) = [c for c in _calls(node) if c.startswith("scontrol")]
    assert "state=drain" in call and "mlx5_0 port 1" in call and "ib.port.state" in call


def test_the_npd_plugin_config_is_what_node_problem_detector_accepts():
    config = json.loads((RECIPES / "npd-gpucheck.json").read_text())
    assert config["plugin"] == "custom"  # NPD's Validate(): the only plugin it supports
    conditions = {c["type"] for c in config["conditions"]}
    timeout = _seconds(config["pluginConfig"]["timeout"])
    assert config["pluginConfig"]["max_output_length"] >= MAX_CHARS
    for rule in config["rules"]:
        assert {"type", "condition", "reason", "path", "timeout"} <= set(rule)
        assert rule["type"] in ("temporary", "permanent")
        assert rule["type"] != "permanent" or rule["condition"] in conditions
        assert _seconds(rule["timeout"]) <= timeout  # else NPD refuses the config
        args = cli.build_parser(rule["args"]).parse_args(rule["args"])
        assert args.command == "health" and args.convention == "npd"
        assert args.format == "line" and args.budget < _seconds(rule["timeout"])


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, f"a Go duration this test reads: {duration}"
    return int(match[1]) * (60 if match[2] == "m" else 1)


def _configmap_json(text: str) -> str:
    """The block scalar under `gpucheck.json: |`, without a YAML library."""
    lines = text.split("gpucheck.json: |\n", 1)[1].splitlines()
    return "\n".join(line[4:] for line in lines[:next(
        i for i, line in enumerate(lines) if line and not line.startswith("    "))])


def test_the_daemonset_carries_the_same_plugin_config_and_mounts_what_health_reads():
    text = (RECIPES / "npd-daemonset.yaml").read_text()
    config = json.loads((RECIPES / "npd-gpucheck.json").read_text())
    assert json.loads(_configmap_json(text)) == config
    assert "mountPath: /host/sys" in text and "mountPath: /var/lib/gpucheck" in text


def test_the_daemonset_parses_as_kubernetes_objects():
    yaml = pytest.importorskip("yaml")
    configmap, daemonset = yaml.safe_load_all((RECIPES / "npd-daemonset.yaml").read_text())
    assert (configmap["kind"], daemonset["kind"]) == ("ConfigMap", "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert "--config.custom-plugin-monitor=/config/gpucheck.json" in container["command"]


def test_the_textfile_script_writes_prometheus_text_atomically(node):
    parser = pytest.importorskip("prometheus_client.parser")
    textfile = node["dir"] / "textfile"
    textfile.mkdir()
    done = _run("prometheus-textfile.sh", node, TEXTFILE_DIR=str(textfile))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert [p.name for p in textfile.iterdir()] == ["gpucheck.prom"]  # no temp file left
    families = {f.name: f for f in parser.text_string_to_metric_families(
        (textfile / "gpucheck.prom").read_text())}
    assert families["gpucheck_verdict"].samples[0].value == 0
    assert "gpucheck_valid_until_timestamp_seconds" in families


def test_the_alert_rules_name_only_metrics_gpucheck_writes():
    parser = pytest.importorskip("prometheus_client.parser")
    from gpucheck.render.headline import render_prometheus
    from gpucheck.report import Report, Section, ok

    report = Report(command="health", sections=[Section("health", "run", {
        "valid_until": "2026-11-24T10:10:00+00:00"}, [ok("gpu.count", "8 GPU(s)")])])
    comm = Report.from_dict(json.loads((REPO / "tests/data/reports/comm.json").read_text()))
    written = {f.name for r in (report, comm)
               for f in parser.text_string_to_metric_families(render_prometheus(r))}
    rules = (RECIPES / "prometheus-alerts.yml").read_text()
    named = set(re.findall(r"\bgpucheck_[a-z_]+", rules))
    assert named and named <= written


def test_the_alert_rules_parse_as_a_prometheus_rule_file():
    yaml = pytest.importorskip("yaml")
    rules = yaml.safe_load((RECIPES / "prometheus-alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        assert {"alert", "expr"} <= set(rule)


def _drains(node: dict) -> list[str]:
    return [c for c in _calls(node) if c.startswith("scontrol") and "state=drain" in c]


def test_the_healthcheck_wrapper_keeps_a_node_drained_until_the_fault_is_cleared(node):
    _sick(node)
    drained = "gpucheck health FAIL reset-gpu: GPU 0 (bus 00000000:18:00.0)"
    for _ in range(2):  # a later run reads no new line: the fault is still reported
        node["calls"].unlink(missing_ok=True)
        _run("slurm-healthcheck.sh", node, FAKE_REASON=drained)
        assert len(_drains(node)) == 1 and "state=resume" not in "".join(_calls(node))
    _set_healthy(node)
    node["calls"].unlink()
    _run("slurm-healthcheck.sh", node, FAKE_REASON=drained)
    assert "scontrol update nodename=gpu-node-7 state=resume" in _calls(node)


@pytest.mark.parametrize("first", ["prometheus-textfile.sh", "slurm-prolog.sh"])
def test_another_recipe_run_first_never_takes_the_healthcheck_s_xid(node, first):
    """The recipes share the default state dir: a duplicate, never a loss."""
    textfile = node["dir"] / "textfile"
    textfile.mkdir()
    _sick(node)
    _run(first, node, TEXTFILE_DIR=str(textfile))
    node["calls"].unlink(missing_ok=True)
    _run("slurm-healthcheck.sh", node)
    assert len(_drains(node)) == 1


def test_the_textfile_still_shows_an_xid_the_healthcheck_read_first(node):
    parser = pytest.importorskip("prometheus_client.parser")
    textfile = node["dir"] / "textfile"
    textfile.mkdir()
    write_log(node["kernel_log"], [xid_line(60.0, "0000:18:00", 32, "Invalid push buffer")])
    _run("slurm-healthcheck.sh", node)
    _run("prometheus-textfile.sh", node, TEXTFILE_DIR=str(textfile))
    families = {f.name: f for f in parser.text_string_to_metric_families(
        (textfile / "gpucheck.prom").read_text())}
    xids = [s for s in families["gpucheck_check_status"].samples
            if s.labels["check"] == "kernel_log.xid"]
    assert [(s.labels["status"], s.value) for s in xids] == [("WARN", 2)]
