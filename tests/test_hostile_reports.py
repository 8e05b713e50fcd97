"""Valid JSON with odd values is a clear error, never a traceback; identity is checked.

compare and --baseline: exit 2 with one line (exit 1 means "B is worse" to a CI
gate). fleet: the odd file is an unreadable node, named with why, the rest judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucheck.analysis.loading import load_report
from gpucheck.analysis.nodes import group_reports
from gpucheck.cli import main
from gpucheck.report import Report, ReportShapeError

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
# (where in env_gpu.json, the odd value, what the refusal says)
ODD_VALUES: list[tuple[tuple[Any, ...], Any, str]] = [
    (("sections", 4, "data", "gpus"), 7, "wrong type"),  # the gpus table a number
    (("sections", 0, "findings", 0), ["check", "OK"], "no check id"),
    (("sections", 0, "findings", 0, "status"), {"FAIL": 1}, "no check id"),
    (("host",), ["gpu01"], "not a string"),
]


def sample(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / name).read_text())


def write(path: Path, raw: dict[str, Any] | str) -> Path:
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


def odd_text(kind: str) -> str:
    """Report text no json.dumps would write: huge integers, a lone surrogate."""
    text = (REPORTS / "env_gpu.json").read_text()
    if kind == "surrogate":
        return text.replace('"host": "', '"host": "\\ud800', 1)
    return text.replace('"schema_version": 3', '"schema_version": 3, "n": ' + "9" * 5000, 1)


def fleet(tmp_path: Path, *inputs: Path, code: int) -> dict[str, Any]:
    out = tmp_path / "out" / "fleet.json"
    out.parent.mkdir(exist_ok=True)
    assert main(["fleet", *map(str, inputs), "-q", "-o", str(out)]) == code
    return json.loads(out.read_text())


def findings(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for s in report["sections"] for f in s["findings"] if f["check"] == check]


def test_one_odd_node_is_an_unreadable_node_and_the_fleet_is_still_judged(
        tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i, (path, value, said) in enumerate(ODD_VALUES):
        raw = sample("env_gpu.json")
        where = raw
        for step in path[:-1]:
            where = where[step]
        where[path[-1]] = value
        write(folder / f"odd{i}.json", raw)
        if said != "wrong type":  # a data table's type is the fleet loader's to judge
            with pytest.raises(ReportShapeError, match="damaged report"):
                Report.from_dict(raw)
    with pytest.raises(ReportShapeError):
        Report.from_dict([1, 2])  # type: ignore[arg-type]
    write(folder / "huge.json", odd_text("5000 digits"))
    write(folder / "surrogate.json", odd_text("surrogate"))
    write(folder / "good.json", sample("stress_fail.json"))
    report = fleet(tmp_path, folder, code=1)  # good.json FAILs
    inputs = next(s for s in report["sections"] if s["name"] == "inputs")
    unreadable = {Path(u["file"]).name: u["problem"] for u in inputs["data"]["unreadable"]}
    assert set(unreadable) == {"odd0.json", "odd1.json", "odd2.json", "odd3.json",
                               "huge.json", "surrogate.json"}
    assert "digits" in unreadable["huge.json"] and "surrogate" in unreadable["surrogate.json"]
    for i, (_, _, said) in enumerate(ODD_VALUES):  # each says why, in one line
        assert said in unreadable[f"odd{i}.json"] and "\n" not in unreadable[f"odd{i}.json"]
    assert inputs["data"]["reports"] == 1


# --- identity -----------------------------------------------------------------------

def claiming(path: Path, name: str, host: str, created_at: str) -> Path:
    raw = sample(name)
    raw["host"], raw["created_at"] = host, created_at
    return write(path, raw)


def test_a_healthy_copy_claiming_a_failing_host_cannot_hide_its_fail(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    claiming(folder / "gpu07.json", "stress_fail.json", "gpu07", "2026-01-01T10:00:00")
    claiming(folder / "copy.json", "stress.json", "gpu07", "2026-01-02T10:00:00")
    report = fleet(tmp_path, folder, code=1)
    dup = findings(report, "fleet.duplicate_host")
    assert len(dup) == 1 and dup[0]["status"] == "FAIL" and dup[0]["subject"] == "gpu07"
    assert "gpu07.json" in dup[0]["message"] and "copy.json" in dup[0]["message"]
    actions = next(s for s in report["sections"] if s["name"] == "actions")
    hidden = [r for r in actions["data"]["reasons"] if "not the judged report" in r["message"]]
    assert hidden and all(r["node"] == "gpu07" and r["status"] == "FAIL" for r in hidden)


def test_two_healthy_files_of_one_host_are_a_warn_naming_both(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    claiming(folder / "a.json", "stress.json", "gpu01", "2026-01-01T10:00:00")
    claiming(folder / "b.json", "stress.json", "gpu01", "2026-01-02T10:00:00")
    claiming(folder / "c.json", "stress.json", "gpu02", "2026-01-02T10:00:00")
    dup = findings(fleet(tmp_path, folder, code=0), "fleet.duplicate_host")
    assert [(f["status"], f["subject"]) for f in dup] == [("WARN", "gpu01")]
    assert "a.json" in dup[0]["message"] and "b.json" in dup[0]["message"]


def test_a_report_dated_in_the_future_is_flagged(tmp_path: Path) -> None:
    future = load_report(str(claiming(tmp_path / "f.json", "stress.json", "gpu03",
                                      "2099-01-01T00:00:00+00:00")))
    today = load_report(str(claiming(tmp_path / "t.json", "stress.json", "gpu04",
                                     "2026-01-01T00:00:00+00:00")))
    grouped = group_reports([future, today], [], now=1.8e9)  # 2027-01
    assert [r.path for r in grouped.future] == [future.path]
    assert not grouped.duplicates and not grouped.shadowed  # one file per host
    report = fleet(tmp_path, Path(future.path), Path(today.path), code=0)
    assert not report["created_at"].startswith("2099")  # the forged date is not taken
    flagged = findings(report, "fleet.future_report")
    assert len(flagged) == 1 and flagged[0]["subject"] == "gpu03"
    assert flagged[0]["status"] == "WARN" and "2099" in flagged[0]["message"]


def test_one_file_named_twice_through_a_symlink_is_no_duplicate_host(tmp_path: Path) -> None:
    real = claiming(tmp_path / "gpu01.json", "stress.json", "gpu01", "2026-01-01T10:00:00")
    (tmp_path / "link.json").symlink_to(real)
    report = fleet(tmp_path, real, tmp_path / "link.json", tmp_path / "." / "gpu01.json", code=0)
    assert not findings(report, "fleet.duplicate_host")
