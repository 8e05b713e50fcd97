"""Valid JSON with odd values is a clear error, never a traceback; identity is checked.

compare and --baseline: exit 2 with one line (exit 1 means "B is worse" to a CI
gate). fleet: the odd file is an unreadable node, named with why, the rest judged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpucheck.analysis.loading import load_report
from gpucheck.analysis.nodes import group_reports
from gpucheck.cli import main
from gpucheck.report import Report, ReportShapeError

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
Edit = Callable[[dict[str, Any]], None]


def sample(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / name).read_text())


def write(path: Path, raw: dict[str, Any] | str) -> Path:
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in raw["sections"] if s["name"] == name)


def _gpus_table_is_a_number(raw: dict[str, Any]) -> None:
    _section(raw, "gpus")["data"]["gpus"] = 7


def _finding_is_a_list(raw: dict[str, Any]) -> None:
    raw["sections"][0]["findings"][0] = ["check", "OK"]


def _status_is_an_object(raw: dict[str, Any]) -> None:
    raw["sections"][0]["findings"][0]["status"] = {"FAIL": 1}


def _host_is_a_list(raw: dict[str, Any]) -> None:
    raw["host"] = ["gpu01"]


ODD_VALUES: dict[str, tuple[Edit, str]] = {
    "table replaced by a number": (_gpus_table_is_a_number, "wrong type"),
    "list where an object belongs": (_finding_is_a_list, "no check id"),
    "status an object": (_status_is_an_object, "no check id"),
    "host a list": (_host_is_a_list, "not a string"),
}


def odd_text(kind: str) -> str:
    """Report text no json.dumps would write: huge integers, a lone surrogate."""
    text = (REPORTS / "env_gpu.json").read_text()
    if kind == "surrogate":
        return text.replace('"host": "', '"host": "\\ud800', 1)
    return text.replace('"schema_version": 3', '"schema_version": 3, "n": ' + "9" * 5000, 1)


def test_one_odd_node_is_an_unreadable_node_and_the_fleet_is_still_judged(
        tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i, (edit, _) in enumerate(ODD_VALUES.values()):
        raw = sample("env_gpu.json")
        edit(raw)
        write(folder / f"odd{i}.json", raw)
    write(folder / "huge.json", odd_text("5000 digits"))
    write(folder / "surrogate.json", odd_text("surrogate"))
    good = sample("stress_fail.json")
    write(folder / "good.json", good)
    out = tmp_path / "fleet.json"
    assert main(["fleet", str(folder), "-q", "-o", str(out)]) == 1  # good.json FAILs
    report = json.loads(out.read_text())
    inputs = next(s for s in report["sections"] if s["name"] == "inputs")
    unreadable = {Path(u["file"]).name: u["problem"] for u in inputs["data"]["unreadable"]}
    assert set(unreadable) == {"odd0.json", "odd1.json", "odd2.json", "odd3.json",
                               "huge.json", "surrogate.json"}
    assert "digits" in unreadable["huge.json"] and "surrogate" in unreadable["surrogate.json"]
    for i, (_, said) in enumerate(ODD_VALUES.values()):  # each says why, in one line
        assert said in unreadable[f"odd{i}.json"] and "\n" not in unreadable[f"odd{i}.json"]
    assert inputs["data"]["reports"] == 1


def test_report_from_dict_raises_one_error_type_for_wrong_types() -> None:
    raw = sample("env_gpu.json")
    assert Report.from_dict(raw).host == raw["host"]  # the healthy case reads
    for edit in (_host_is_a_list, _finding_is_a_list, _status_is_an_object):
        broken = sample("env_gpu.json")
        edit(broken)
        with pytest.raises(ReportShapeError, match="damaged report"):
            Report.from_dict(broken)
    with pytest.raises(ReportShapeError):
        Report.from_dict([1, 2])  # type: ignore[arg-type]


# --- identity -----------------------------------------------------------------------

def _claiming(name: str, host: str, created_at: str) -> dict[str, Any]:
    raw = sample(name)
    raw["host"], raw["created_at"] = host, created_at
    return raw


def test_a_healthy_copy_claiming_a_failing_host_cannot_hide_its_fail(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    write(folder / "gpu07.json", _claiming("stress_fail.json", "gpu07", "2026-01-01T10:00:00"))
    write(folder / "copy.json", _claiming("stress.json", "gpu07", "2026-01-02T10:00:00"))
    out = tmp_path / "fleet.json"
    assert main(["fleet", str(folder), "-q", "-o", str(out)]) == 1
    report = json.loads(out.read_text())
    dup = [f for s in report["sections"] for f in s["findings"]
           if f["check"] == "fleet.duplicate_host"]
    assert len(dup) == 1 and dup[0]["status"] == "FAIL" and dup[0]["subject"] == "gpu07"
    assert "gpu07.json" in dup[0]["message"] and "copy.json" in dup[0]["message"]
    actions = next(s for s in report["sections"] if s["name"] == "actions")
    hidden = [r for r in actions["data"]["reasons"] if "not the judged report" in r["message"]]
    assert hidden and all(r["node"] == "gpu07" and r["status"] == "FAIL" for r in hidden)


def test_two_healthy_files_of_one_host_are_a_warn_naming_both(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    write(folder / "a.json", _claiming("stress.json", "gpu01", "2026-01-01T10:00:00"))
    write(folder / "b.json", _claiming("stress.json", "gpu01", "2026-01-02T10:00:00"))
    write(folder / "c.json", _claiming("stress.json", "gpu02", "2026-01-02T10:00:00"))
    out = tmp_path / "fleet.json"
    assert main(["fleet", str(folder), "-q", "-o", str(out)]) == 0
    findings = [f for s in json.loads(out.read_text())["sections"] for f in s["findings"]]
    dup = [f for f in findings if f["check"] == "fleet.duplicate_host"]
    assert [(f["status"], f["subject"]) for f in dup] == [("WARN", "gpu01")]
    assert "a.json" in dup[0]["message"] and "b.json" in dup[0]["message"]


def test_one_file_per_host_gives_no_identity_finding(tmp_path: Path) -> None:
    loaded = [load_report(str(write(tmp_path / f"{h}.json",
                                    _claiming("stress.json", h, "2026-01-01T10:00:00"))))
              for h in ("gpu01", "gpu02")]
    fleet = group_reports(loaded, [], now=1.8e9)
    assert not fleet.duplicates and not fleet.future and not fleet.shadowed


def test_a_report_dated_in_the_future_is_flagged(tmp_path: Path) -> None:
    future = load_report(str(write(tmp_path / "f.json", _claiming(
        "stress.json", "gpu03", "2099-01-01T00:00:00+00:00"))))
    today = load_report(str(write(tmp_path / "t.json", _claiming(
        "stress.json", "gpu04", "2026-01-01T00:00:00+00:00"))))
    fleet = group_reports([future, today], [], now=1.8e9)  # 2027-01
    assert [r.path for r in fleet.future] == [future.path]
    out = tmp_path / "fleet.json"
    assert main(["fleet", future.path, today.path, "-q", "-o", str(out)]) == 0
    fleet_report = json.loads(out.read_text())
    assert not fleet_report["created_at"].startswith("2099")  # the forged date is not taken
    findings = [f for s in fleet_report["sections"] for f in s["findings"]]
    flagged = [f for f in findings if f["check"] == "fleet.future_report"]
    assert len(flagged) == 1 and flagged[0]["subject"] == "gpu03"
    assert flagged[0]["status"] == "WARN" and "2099" in flagged[0]["message"]


def test_one_file_named_twice_through_a_symlink_is_no_duplicate_host(tmp_path: Path) -> None:
    real = write(tmp_path / "gpu01.json", _claiming("stress.json", "gpu01",
                                                    "2026-01-01T10:00:00"))
    (tmp_path / "link.json").symlink_to(real)
    out = tmp_path / "out" / "fleet.json"
    out.parent.mkdir()
    assert main(["fleet", str(real), str(tmp_path / "link.json"), str(tmp_path / "." /
                                                                     "gpu01.json"),
                 "-q", "-o", str(out)]) == 0
    findings = [f for s in json.loads(out.read_text())["sections"] for f in s["findings"]]
    assert not [f for f in findings if f["check"] == "fleet.duplicate_host"]
