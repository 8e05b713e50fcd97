"""`gpucheck compare A.json B.json` on saved reports: tables, verdicts, exit codes, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpucheck.cli import main

REPORTS = Path(__file__).resolve().parent / "data" / "reports"


def path(name: str) -> str:
    return str(REPORTS / f"{name}.json")


def compare(tmp_path: Path, a: str, b: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "compare.json"
    code = main(["compare", a, b, "-q", "-o", str(out), *extra])
    return code, json.loads(out.read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def findings(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for s in report["sections"] for f in s["findings"] if f["check"] == check]


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in section(report, "metrics")["data"]["metrics"]}


def test_a_slow_node_fails_naming_the_slower_rank_and_its_change(tmp_path: Path) -> None:
    code, report = compare(tmp_path, path("bench"), path("bench_slow"))
    assert code == 1 and report["command"] == "compare" and report["verdict"] == "FAIL"
    slow = rows(report)["bench.images_per_s.rank1"]
    assert (slow["verdict"], slow["change_pct"], slow["better"]) == ("worse", -40.0, "higher")
    assert rows(report)["bench.images_per_s.rank0"]["verdict"] == "same"
    regressions = findings(report, "compare.regression")
    assert any("bench.images_per_s.rank1" in f["message"] and f["subject"] == "rank1"
               and f["status"] == "FAIL" and f["action"] == "rerun" for f in regressions)
    # a larger threshold lets the same change pass
    code, report = compare(tmp_path, path("bench"), path("bench_slow"), "--threshold", "70%")
    assert code == 0 and not findings(report, "compare.regression")
    assert section(report, "metrics")["data"]["threshold"] == 0.7


def test_findings_that_appeared_in_b_are_listed_with_their_action(tmp_path: Path) -> None:
    _, report = compare(tmp_path, path("bench"), path("bench_slow"))
    changes = section(report, "findings")["data"]["changes"]
    assert [(c["change"], c["status"], c["check"], c["action"]) for c in changes] == [
        ("new in B", "WARN", "bench.rank.straggler", "rerun")]
    _, back = compare(tmp_path, path("bench_slow"), path("bench"))
    assert [c["change"] for c in section(back, "findings")["data"]["changes"]] == [
        "gone in B"]


def test_a_report_compared_with_itself_changes_nothing(tmp_path: Path) -> None:
    code, report = compare(tmp_path, path("stress"), path("stress"))
    assert code == 0 and report["verdict"] == "OK"
    verdicts = {r["verdict"] for r in rows(report).values()}
    assert verdicts <= {"same", "info"} and "same" in verdicts
    assert section(report, "facts")["data"]["differ"] == []


def test_an_older_driver_is_a_version_warning_naming_both_versions(tmp_path: Path) -> None:
    code, report = compare(tmp_path, path("env_gpu"), path("env_gpu_old_driver"))
    assert code == 0
    differ = {r["fact"]: (r["A"], r["B"]) for r in section(report, "facts")["data"]["differ"]}
    assert differ["NVIDIA driver version"] == ("550.54.15", "535.104.05")
    warned = findings(report, "compare.versions")
    assert any(f["subject"] == "NVIDIA driver version" and f["action"] == "fix-config"
               for f in warned)
    assert main(["compare", path("env_gpu"), path("env_gpu_old_driver"), "--strict",
                 "-q", "-o", str(tmp_path / "s.json")]) == 1


def test_a_gpu_fewer_in_b_fails(tmp_path: Path) -> None:
    raw = json.loads(Path(path("env_gpu")).read_text())
    for s in raw["sections"]:
        if s["name"] == "gpus":
            s["data"]["gpus"] = s["data"]["gpus"][:1]
            s["metrics"] = [m for m in s["metrics"] if m["subject"]["gpu"] == 0]
        if s["name"] == "driver":
            s["data"]["gpu_count"] = 1
    b = tmp_path / "one_gpu.json"
    b.write_text(json.dumps(raw))
    code, report = compare(tmp_path, path("env_gpu"), str(b))
    assert code == 1
    assert [(f["status"], f["subject"]) for f in findings(report, "compare.hardware")] == [
        ("FAIL", "GPU count (driver)")]
    assert rows(report)["env.gpu.memory_total_bytes.gpu1"]["verdict"] == "only in A"
    assert findings(report, "compare.missing")


def test_different_settings_warn_that_the_figures_measure_different_things(
        tmp_path: Path) -> None:
    raw = json.loads(Path(path("bench")).read_text())
    section(raw, "bench")["data"]["batch_size"] = 8
    b = tmp_path / "b8.json"
    b.write_text(json.dumps(raw))
    _, report = compare(tmp_path, path("bench"), str(b))
    assert [(f["status"], f["subject"]) for f in findings(report, "compare.setup")] == [
        ("WARN", "bench.batch_size")]


def test_the_same_inputs_give_a_byte_identical_report(tmp_path: Path) -> None:
    outputs = []
    for i in range(2):
        out = tmp_path / f"c{i}.json"
        main(["compare", path("env_gpu"), path("env_gpu_old_driver"), "-q", "-o", str(out)])
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    report = json.loads(outputs[0])
    newest = max(json.loads(Path(path(n)).read_text())["created_at"]
                 for n in ("env_gpu", "env_gpu_old_driver"))
    assert report["created_at"] == newest
    assert report["argv"][:2] == ["gpucheck", "compare"]


def as_all(tmp_path: Path, *names: str) -> str:
    """The saved reports of `names` as one `all` report makes them: sections
    `<command>.<section>`, command "all" (docs/all.md)."""
    raws = [json.loads(Path(path(n)).read_text()) for n in names]
    merged = dict(raws[0], command="all", sections=[
        dict(s, name=f"{r['command']}.{s['name']}") for r in raws for s in r["sections"]])
    out = tmp_path / "all.json"
    out.write_text(json.dumps(merged))
    return str(out)


def test_an_all_report_compares_with_a_single_commands_on_the_sections_both_have(
        tmp_path: Path) -> None:
    """Issue 36 item 7: compare reads an `all` like the single commands (docs/all.md)."""
    combined = as_all(tmp_path, "env", "bench")
    code, report = compare(tmp_path, combined, path("bench_slow"))
    assert code == 1
    assert rows(report)["bench.images_per_s.rank1"]["verdict"] == "worse"
    assert not [n for n in rows(report) if not n.startswith("bench.")]  # env left out
    assert not findings(report, "compare.missing")
    same, _ = compare(tmp_path, path("bench"), combined)
    assert same == 0
    assert main(["compare", combined, path("comm")]) == 2  # comm did not run in it


@pytest.mark.parametrize(("b", "says"), [
    ("malformed", "is not valid JSON"),
    ("not_a_report", "is not a gpucheck report"),
    ("unknown_schema", "unknown schema_version 99"),
    ("bench_v1", "has schema_version 1, written by an older gpucheck"),
    ("env", "compare needs two reports of the same command"),
])
def test_bad_input_is_one_line_naming_the_file_exit_2_and_nothing_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], b: str, says: str) -> None:
    out = tmp_path / "c.json"
    assert main(["compare", path("bench"), path(b), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and f"{b}.json" in err
    assert not out.exists()


@pytest.mark.parametrize("make", ["missing", "directory", "empty", "array"])
def test_unreadable_files_are_one_line_too(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           make: str) -> None:
    target = tmp_path / "b.json"
    if make == "directory":
        target.mkdir()
    elif make == "empty":
        target.write_text("")
    elif make == "array":
        target.write_text("[1, 2]")
    assert main(["compare", path("bench"), str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(target) in err


@pytest.mark.parametrize("threshold", ["0", "1.5", "-5%", "fast", "100%"])
def test_a_threshold_outside_0_to_1_is_a_usage_error(threshold: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", path("bench"), path("bench"), f"--threshold={threshold}"]) == 2
    assert "--threshold" in capsys.readouterr().err


def test_compare_reads_files_whatever_their_name(tmp_path: Path) -> None:
    copy = tmp_path / "report.txt"
    shutil.copy(path("comm"), copy)
    code, report = compare(tmp_path, path("comm"), str(copy))
    assert code == 0 and section(report, "inputs")["data"]["reports"][1]["file"] == str(copy)


def test_the_same_problem_on_another_nodes_gpu_is_not_new(tmp_path: Path) -> None:
    def with_warn(uuid: str, index: int) -> str:
        raw = json.loads(Path(path("env_gpu")).read_text())
        section(raw, "gpus")["findings"].append({
            "check": "gpu.persistence_mode", "status": "WARN", "message": "off",
            "hint": "nvidia-smi -pm 1", "action": "fix-config",
            "subject": f"GPU {index} (NVIDIA H200, bus 00000000:18:00.0, {uuid})",
            "subject_fields": {"kind": "gpu", "label": f"GPU {index} (...)", "gpu": index,
                               "bus_id": "00000000:18:00.0", "uuid": uuid}})
        out = tmp_path / f"{uuid}-{index}.json"
        out.write_text(json.dumps(raw))
        return str(out)
    _, same_slot = compare(tmp_path, with_warn("GPU-aaaa", 1), with_warn("GPU-bbbb", 1))
    assert section(same_slot, "findings")["data"]["changes"] == []
    _, other_slot = compare(tmp_path, with_warn("GPU-aaaa", 1), with_warn("GPU-bbbb", 0))
    assert [(c["change"], c["subject"]) for c in
            section(other_slot, "findings")["data"]["changes"]] == [
        ("new in B", "gpu0"), ("gone in B", "gpu1")]
    [new] = [f for f in findings(other_slot, "compare.findings") if f["status"] == "WARN"]
    assert (new["subject_fields"]["kind"], new["subject_fields"]["gpu"]) == ("gpu", 0)
