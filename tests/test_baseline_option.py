"""`--baseline FILE` on a load command: figures beyond the baseline's limits WARN."""

from __future__ import annotations

import json
from pathlib import Path

from gpucheck.cli import main

COMM = ["comm", "--n-gpus", "2", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
        "--no-pairwise", "--quiet", "--format", "json"]


def _baseline(path: Path, limit: float) -> str:
    entry = {"expected": limit, "limit": limit, "direction": "higher", "unit": "GB/s",
             "nodes": 3, "mad": 0.0}
    path.write_text(json.dumps({
        "kind": "gpucheck-baseline", "schema_version": 1, "tolerance": 0.1,
        "metrics": {"comm.all_reduce.busbw_gbps@1024": entry}}))
    return str(path)


def _baseline_findings(report: Path) -> list[dict]:
    sections = json.loads(report.read_text())["sections"]
    return [f for s in sections if s["name"] == "baseline" for f in s["findings"]]


def test_a_comm_run_below_a_baseline_floor_warns_and_above_it_stays_ok(tmp_path):
    # One run, two verdicts: the same measured figure against an impossible floor and
    # against a floor of zero.
    out = tmp_path / "comm.json"
    high = _baseline(tmp_path / "high.json", 1e9)
    assert main([*COMM, "--baseline", high, "-o", str(out)]) == 0
    found = _baseline_findings(out)
    assert [f["status"] for f in found] == ["WARN"]
    assert "comm.all_reduce.busbw_gbps@1024" in found[0]["message"]
    from gpucheck.analysis.baseline import load_baseline
    from gpucheck.commands.launch import baseline_section
    from gpucheck.report import Report

    report = Report.from_dict(json.loads(out.read_text()))
    report.sections = [s for s in report.sections if s.name != "baseline"]
    low = baseline_section(report, load_baseline(_baseline(tmp_path / "low.json", 0.0)))
    assert [f.status.value for f in low.findings] == ["OK"]


def test_a_baseline_that_is_not_one_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2, "sections": []}')
    out = tmp_path / "comm.json"
    assert main([*COMM, "--baseline", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a gpucheck baseline" in err[0]
    assert not out.exists()
