"""`gpucheck fleet` on fleets built from the saved reports: outliers, drift, missing and
failed nodes, the ranked list, unreadable files, determinism."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpucheck.cli import main

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
MEASURED = {"timing", "all_reduce", "all_gather", "pairwise", "gemm", "membw", "sdc"}
Edit = Callable[[dict[str, Any]], None]


def sample(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / f"{name}.json").read_text())


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, float):
        return value * factor
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    return value


def write_node(folder: Path, name: str, host: str, index: int = 0,
               edit: Edit | None = None) -> Path:
    """The sample report `name` as node `host`: every measured figure moved by a node's
    own small offset (-1%..+1%, as healthy nodes differ), then `edit` applied."""
    raw = sample(name)
    raw["host"] = host
    factor = 1 + ((index * 7) % 11 - 5) / 500
    for section in raw["sections"]:
        if section["name"] in MEASURED:
            section["data"] = _scaled(section["data"], factor)
            for metric in section.get("metrics") or []:
                metric["value"] *= factor
    if edit is not None:
        edit(raw)
    out = folder / f"{name}-{host}.json"
    out.write_text(json.dumps(raw, indent=2))
    return out


def healthy_fleet(folder: Path, name: str, count: int, first: int = 1) -> list[Path]:
    return [write_node(folder, name, f"gpu{i:02d}", i) for i in range(first, first + count)]


# The table column each metric is read from by its producer.
METRIC_OF = {"images_per_s": ("bench.images_per_s",), "gbps_p50": ("stress.membw.gbps",),
             "tflops_p50": ("stress.gemm.bf16.tflops", "stress.gemm.fp32.tflops")}


def rows_where(rank: int, key: str, factor: float) -> Edit:
    """Scale `key` in every table row of rank `rank` (a slow GPU), and its metrics."""
    def edit(raw: dict[str, Any]) -> None:
        for section in raw["sections"]:
            for table in section["data"].values():
                for row in table if isinstance(table, list) else []:
                    if isinstance(row, dict) and row.get("rank") == rank and key in row:
                        row[key] *= factor
            for metric in section.get("metrics") or []:
                if metric["name"] in METRIC_OF[key] and metric["subject"]["rank"] == rank:
                    metric["value"] *= factor
    return edit


def fleet(tmp_path: Path, *inputs: str | Path, extra: tuple[str, ...] = ()
          ) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "fleet-out" / "fleet.json"
    out.parent.mkdir(exist_ok=True)
    code = main(["fleet", *map(str, inputs), "-q", "-o", str(out), *extra])
    return code, json.loads(out.read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def ranked(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(r["node"], r["status"], r["action"])
            for r in section(report, "actions")["data"]["nodes"]]


def reasons(report: dict[str, Any], node: str) -> list[dict[str, Any]]:
    return [r for r in section(report, "actions")["data"]["reasons"] if r["node"] == node]


def test_a_slow_gpu_is_named_with_its_node_gpu_slot_and_metric(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 5)
    write_node(folder, "bench", "gpu09", 9, rows_where(1, "images_per_s", 0.7))
    code, report = fleet(tmp_path, folder)
    assert code == 0  # outliers are WARNs
    outliers = section(report, "outliers")["data"]["outliers"]
    assert [(o["node"], o["metric"], o["against"]) for o in outliers] == [
        ("gpu09", "bench.images_per_s.rank1", "rank1 of 6 nodes")]
    assert outliers[0]["worse_pct"] == pytest.approx(30, abs=2)
    assert ranked(report) == [("gpu09", "WARN", "rerun")]
    [reason] = reasons(report, "gpu09")
    assert (reason["check"], reason["subject"], reason["from"]) == ("fleet.outlier", "rank1",
                                                                    "bench")


def test_each_gpu_slot_is_judged_against_the_same_slot_on_other_nodes(tmp_path: Path) -> None:
    # Rank 1 is 25% slower than rank 0 on every node (its GPU shares a switch, say):
    # against its own slot nothing is wrong, and the one slow rank 0 still stands out.
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(1, 7):
        slow = rows_where(1, "images_per_s", 0.75)
        edit = slow if i != 6 else (lambda raw, s=slow: (s(raw), rows_where(
            0, "images_per_s", 0.85)(raw)))
        write_node(folder, "bench", f"gpu{i:02d}", i, edit)
    _, report = fleet(tmp_path, folder)
    outliers = section(report, "outliers")["data"]["outliers"]
    assert [(o["node"], o["metric"]) for o in outliers] == [
        ("gpu06", "bench.images_per_s.rank0")]


def test_statistics_per_metric_give_median_mad_and_range(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    paths = healthy_fleet(folder, "stress", 4)
    _, report = fleet(tmp_path, folder)
    values = [json.loads(p.read_text()) for p in paths]
    gemm = [next(r for s in v["sections"] if s["name"] == "gemm" for r in s["data"]["results"]
                 if r["rank"] == 0 and r["dtype"] == "bf16")["tflops_p50"] for v in values]
    row = next(r for r in section(report, "metrics")["data"]["metrics"]
               if r["metric"] == "stress.gemm.bf16.tflops.rank0")
    assert row["nodes"] == 4 and row["command"] == "stress"
    assert row["median"] == pytest.approx(sorted(gemm)[1] / 2 + sorted(gemm)[2] / 2, rel=1e-5)
    assert (row["low"], row["high"]) == (pytest.approx(min(gemm), rel=1e-5),
                                         pytest.approx(max(gemm), rel=1e-5))


def test_an_older_driver_is_drift_naming_the_node_and_what_most_have(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(1, 5):
        shutil.copy(REPORTS / "env_gpu.json", folder / f"n{i}.json")
        raw = json.loads((folder / f"n{i}.json").read_text())
        raw["host"] = f"gpu{i:02d}"
        (folder / f"n{i}.json").write_text(json.dumps(raw))
    shutil.copy(REPORTS / "env_gpu_old_driver.json", folder)
    _, report = fleet(tmp_path, folder)
    drift = {d["fact"]: d for d in section(report, "drift")["data"]["drift"]}
    driver = drift["NVIDIA driver version"]
    assert (driver["most_nodes"], driver["nodes"]) == ("550.54.15", 4)
    assert driver["differ"] == "535.104.05 on 1: node-olddrv"
    node = reasons(report, "node-olddrv")
    assert {(r["check"], r["subject"], r["action"]) for r in node if r["from"] == "env"
            and r["check"] == "fleet.drift"} == {
        ("fleet.drift", "NVIDIA driver version", "fix-config"),
        ("fleet.drift", "CUDA driver version", "fix-config")}


def test_a_node_with_fewer_gpus_than_the_rest_fails_drift(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()

    def one_gpu(raw: dict[str, Any]) -> None:
        section(raw, "driver")["data"]["gpu_count"] = 1
    for i in range(1, 4):
        write_node(folder, "env_gpu", f"gpu{i:02d}", i)
    write_node(folder, "env_gpu", "gpu04", 4, one_gpu)
    code, report = fleet(tmp_path, folder)
    assert code == 1
    assert ("fleet.drift", "FAIL", "drain-node") in {
        (r["check"], r["status"], r["action"]) for r in reasons(report, "gpu04")}


def test_missing_nodes_are_named_from_a_slurm_node_list(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)  # gpu01..gpu03
    write_node(folder, "bench", "spare1", 9)
    write_node(folder, "bench", "gpu05.cluster.example", 5)  # counts as SLURM's gpu05
    code, report = fleet(tmp_path, folder, extra=("--nodes", "gpu[01-05],gpu07"))
    assert code == 1
    nodes = section(report, "nodes")
    assert nodes["data"]["missing"] == ["gpu04", "gpu07"]
    assert nodes["data"]["expected"] == 6
    assert ranked(report)[:2] == [("gpu04", "FAIL", "rerun"), ("gpu07", "FAIL", "rerun")]
    [unexpected] = [f for f in nodes["findings"] if f["check"] == "fleet.unexpected"]
    assert "spare1" in unexpected["message"] and unexpected["status"] == "WARN"


def test_an_expected_count_without_names_reports_the_shortfall(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    code, report = fleet(tmp_path, folder, extra=("--expect-nodes", "4"))
    assert code == 1
    [missing] = [f for f in section(report, "nodes")["findings"] if f["check"] == "fleet.missing"]
    assert "3 report(s) from 4 expected" in missing["message"]


def test_a_node_missing_one_command_is_named_for_that_command(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    healthy_fleet(folder, "stress", 2)  # gpu03 sent no stress report
    _, report = fleet(tmp_path, folder)
    assert [(r["check"], r["message"]) for r in reasons(report, "gpu03")] == [
        ("fleet.missing", "no stress report (it sent others)")]
    commands = {r["command"]: r["nodes"] for r in section(report, "nodes")["data"]["commands"]}
    assert commands == {"bench": 3, "stress": 2}


def test_a_fail_node_comes_first_with_its_own_findings_action(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "stress", 3)
    write_node(folder, "bench", "gpu01", 1)
    write_node(folder, "bench", "gpu02", 2, rows_where(0, "images_per_s", 0.5))
    write_node(folder, "bench", "gpu03", 3)
    shutil.copy(REPORTS / "stress_fail.json", folder)
    code, report = fleet(tmp_path, folder)
    assert code == 1
    assert ranked(report)[0] == ("node-bad", "FAIL", "drain-node")
    first = reasons(report, "node-bad")[0]
    assert (first["check"], first["from"], first["subject"]) == ("stress.sdc.repeat",
                                                                 "stress", "rank 1")
    assert ("gpu02", "WARN", "rerun") in ranked(report)


def test_a_failed_run_is_listed_and_its_node_ranked(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "comm", 3)
    shutil.copy(REPORTS / "comm_failed.json", folder)
    _, report = fleet(tmp_path, folder)
    [row] = section(report, "nodes")["data"]["commands"]
    assert (row["run_failed"], row["FAIL"]) == ("node-died", 1)
    assert ("node-died", "FAIL", "rerun") in ranked(report)


def test_unreadable_files_are_listed_and_the_rest_judged(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    for bad in ("malformed", "not_a_report", "unknown_schema"):
        shutil.copy(REPORTS / f"{bad}.json", folder)
    write_node(folder, "bench_v1", "gpu04", 4)  # schema 1: run it again
    code, report = fleet(tmp_path, folder)
    assert code == 0
    inputs = section(report, "inputs")
    assert [(Path(u["file"]).name, u["problem"].split(" (")[0].split(",")[0])
            for u in inputs["data"]["unreadable"]] == [
        ("bench_v1-gpu04.json", "has schema_version 1"),
        ("malformed.json", "is not valid JSON"),
        ("not_a_report.json", "is not a gpucheck report"),
        ("unknown_schema.json", "has unknown schema_version 99")]
    assert "written by an older gpucheck" in inputs["data"]["unreadable"][0]["problem"]
    assert inputs["data"]["reports"] == 3
    assert [f["check"] for f in inputs["findings"] if f["status"] != "OK"] == [
        "fleet.unreadable"] * 4
    assert reasons(report, "gpu04") == []


def test_reports_of_every_command_are_grouped_by_command(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for name in ("bench", "comm", "stress", "env"):
        healthy_fleet(folder, name, 3)
    code, report = fleet(tmp_path, folder)
    assert code == 0 and report["verdict"] == "OK" and ranked(report) == []
    commands = {r["command"] for r in section(report, "metrics")["data"]["metrics"]}
    assert commands == {"bench", "comm", "stress", "env"}
    assert section(report, "inputs")["data"]["commands"] == (
        "bench (3), comm (3), env (3), stress (3)")


def test_an_older_report_of_the_same_node_and_analysis_reports_are_left_out(
        tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    write_node(folder / "..", "bench", "gpu01", 1,
               lambda raw: raw.update(created_at="2020-01-01T00:00:00+00:00"))
    shutil.move(str(tmp_path / "bench-gpu01.json"), folder / "old-gpu01.json")
    main(["compare", str(REPORTS / "bench.json"), str(REPORTS / "bench.json"), "-q", "-o",
          str(folder / "compare.json")])
    _, report = fleet(tmp_path, folder)
    unused = {Path(u["file"]).name: u["why"] for u in section(report, "inputs")["data"]["unused"]}
    assert set(unused) == {"old-gpu01.json", "compare.json"}
    assert unused["old-gpu01.json"].startswith("an older bench report of gpu01")


def test_the_same_inputs_give_the_same_report_dated_when_fleet_ran(tmp_path: Path) -> None:
    """Issue 36 item 7: the header's time is the fleet's own (it said the newest
    input's), the inputs' span is data; all else is identical for the same inputs."""
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 4)
    write_node(folder, "bench", "gpu09", 9, rows_where(1, "images_per_s", 0.5))
    shutil.copy(REPORTS / "malformed.json", folder)
    outputs = []
    for i in range(2):
        out = tmp_path / f"f{i}.json"
        main(["fleet", str(folder), "--nodes", "gpu[01-10]", "-q", "-o", str(out)])
        outputs.append(json.loads(out.read_bytes()))
    assert [dict(o, created_at=None) for o in outputs[0:1]] == [
        dict(o, created_at=None) for o in outputs[1:]]
    written = sorted(json.loads(p.read_text())["created_at"] for p in folder.glob("bench-*.json"))
    assert (section(outputs[0], "inputs")["data"]["written_from"],
            section(outputs[0], "inputs")["data"]["written_to"]) == (written[0], written[-1])
    assert outputs[0]["created_at"] > written[-1]  # when fleet ran, after its inputs


def test_the_order_files_are_given_in_changes_nothing_but_the_command_line(
        tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    paths = [*healthy_fleet(folder, "stress", 4),
             write_node(folder, "stress", "gpu09", 9, rows_where(0, "tflops_p50", 0.5))]
    _, forward = fleet(tmp_path, *paths)
    _, backward = fleet(tmp_path, *reversed(paths))
    assert forward["sections"] == backward["sections"]


@pytest.mark.parametrize(("given", "says"), [
    ("empty", "empty: no .json report files in this directory"),
    ("nope", "nope: no such file or directory"),
])
def test_an_empty_directory_or_no_such_path_is_a_usage_error_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, says: str) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "fleet.json"
    assert main(["fleet", str(tmp_path / given), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not out.exists()


@pytest.mark.parametrize(("files", "says"), [
    (["malformed"], "malformed.json: is not valid JSON"),
    (["not_a_report", "unknown_schema"], "(and 1 more unreadable)"),
])
def test_only_unreadable_files_is_a_usage_error_naming_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[str],
        says: str) -> None:
    out = tmp_path / "fleet.json"
    assert main(["fleet", *(str(REPORTS / f"{f}.json") for f in files), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not out.exists()


@pytest.mark.parametrize(("extra", "says"), [
    (("--nodes", "gpu[03-01]"), "--nodes"),
    (("--nodes", "gpu[01-02]", "--expect-nodes", "3"), "disagrees"),
    (("--expect-nodes", "0"), "--expect-nodes"),
    (("--threshold", "2"), "--threshold"),
    (("--mad-k", "0"), "--mad-k"),
])
def test_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                      extra: tuple[str, ...], says: str) -> None:
    assert main(["fleet", str(REPORTS / "bench.json"), *extra]) == 2
    assert says in capsys.readouterr().err


def test_a_single_healthy_report_is_a_fleet_of_one(tmp_path: Path) -> None:
    code, report = fleet(tmp_path, REPORTS / "bench.json")
    assert code == 0 and report["host"] == "1 node" and report["verdict"] == "OK"
    assert ranked(report) == []
    assert os.path.basename(report["argv"][2]) == "bench.json"


def test_an_outlier_names_the_gpu_its_rank_used(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()

    def on_gpus(raw: dict[str, Any]) -> None:
        for s in raw["sections"]:
            for metric in s.get("metrics") or []:
                rank = (metric["subject"] or {}).get("rank")
                if rank is not None:
                    bus = f"0000000{rank}:18:00.0"
                    metric["subject"] = {"kind": "rank", "rank": rank, "gpu": rank,
                                         "bus_id": bus,
                                         "label": f"GPU {rank} (NVIDIA H200, bus {bus})"}
    for i in range(1, 5):
        write_node(folder, "stress", f"gpu{i:02d}", i, on_gpus)
    write_node(folder, "stress", "gpu05", 5, lambda raw: (on_gpus(raw), rows_where(
        1, "gbps_p50", 0.5)(raw)))
    _, report = fleet(tmp_path, folder)
    [outlier] = section(report, "outliers")["data"]["outliers"]
    assert (outlier["node"], outlier["metric"], outlier["gpu"]) == (
        "gpu05", "stress.membw.gbps.rank1", "GPU 1 (NVIDIA H200, bus 00000001:18:00.0)")
    assert reasons(report, "gpu05")[0]["subject"] == outlier["gpu"]


def test_a_fleet_written_into_its_own_directory_does_not_read_itself(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    argv = ["fleet", str(folder), "-q", "-o", str(folder / "fleet.json"), "--save-baseline",
            str(folder / "baseline.json")]
    outputs = []
    for _ in range(2):
        assert main(argv) == 0
        outputs.append((folder / "fleet.json").read_bytes())
    assert outputs[0] == outputs[1]
    inputs = section(json.loads(outputs[1]), "inputs")["data"]
    assert inputs["unused"] == [] and inputs["unreadable"] == []


def test_a_nodes_other_problems_are_counted_apart_from_the_actions_they_call_for() -> None:
    """Issue 36 item 7: "(+2 more: drain-node, fix-config, rerun)" named three actions
    for two more problems; the count and the list now say what they are."""
    from gpucheck.analysis.fleet import _actions_section
    from gpucheck.analysis.nodes import Reason

    found = [Reason("n1", "FAIL", "drain-node", "stress.sdc.repeat", "wrong"),
             Reason("n1", "WARN", "fix-config", "stress.numa", "unbound"),
             Reason("n1", "WARN", "rerun", "bench.rank.straggler", "slow")]
    actions = _actions_section(found, 1)
    (row,) = actions.data["nodes"]
    assert (row["problems"], row["all_actions"]) == (3, "drain-node, fix-config, rerun")
    (node,) = actions.findings
    assert f"+{row['problems'] - 1} more;" in node.message
