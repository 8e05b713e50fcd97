"""The report model and its three renderers, without any probe."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpucheck import subject
from gpucheck.errors import UsageError
from gpucheck.output import check_writable, write_atomic
from gpucheck.render import format_for, render
from gpucheck.report import Report, SchemaVersionError, Section, Status, fail, ok, skip, warn


def sample_report() -> Report:
    report = Report(command="env", argv=["gpucheck", "env"], host="node7")
    report.add(Section("system", "System", {"os": "Debian 12", "cpu_cores": 2, "ram_gib": 23.4,
                                            "nested": {"a": None, "b": True}},
                       [ok("system.shm", "/dev/shm is 12 GiB")]))
    report.add(Section("gpus", "GPUs", {"gpus": [{"index": 0, "name": "H200", "temp_c": 41},
                                                 {"index": 1, "name": "H200", "temp_c": None}]},
                       [warn("gpu.pcie.width", "x8 of x16", "reseat the card", subject.gpu(1)),
                        fail("gpu.ecc.volatile_uncorrected", "3 errors", "drain the node",
                             subject.gpu(1)),
                        skip("faults.nvlink.crc", "no NVLink")]))
    return report


def test_summary_counts_every_status_and_the_worst_is_the_verdict() -> None:
    report = sample_report()
    assert report.summary() == {"OK": 1, "SKIP": 1, "WARN": 1, "FAIL": 1}
    assert report.verdict() is Status.FAIL


@pytest.mark.parametrize(
    ("statuses", "strict", "code"),
    [([], False, 0), ([Status.OK, Status.SKIP], False, 0), ([Status.WARN], False, 0),
     ([Status.WARN], True, 1), ([Status.FAIL], False, 1), ([Status.OK, Status.FAIL], True, 1)],
)
def test_exit_code_follows_the_worst_finding(statuses: list[Status], strict: bool,
                                             code: int) -> None:
    section = Section("s", "S", findings=[
        {Status.OK: ok, Status.SKIP: skip}.get(s, lambda c, m: warn(c, m, "h"))("gpu.busy", "m")
        if s is not Status.FAIL else fail("gpu.busy", "m", "h") for s in statuses])
    assert Report("env", [section]).exit_code(strict=strict) == code


def test_json_round_trips_through_the_schema() -> None:
    report = sample_report()
    raw = json.loads(render(report, "json"))
    assert raw["schema_version"] == 3
    assert raw["verdict"] == "FAIL"
    assert raw["sections"][1]["findings"][1]["hint"] == "drain the node"
    assert [f["action"] for f in raw["sections"][1]["findings"]] == [
        "replace-hardware", "drain-node", None]
    again = Report.from_dict(raw)
    assert again.to_dict() == report.to_dict()


@pytest.mark.parametrize("version", [99, 0, None, "2", True, 1, 2])
def test_json_of_an_unknown_or_older_schema_version_is_refused_in_one_line(
        version: object) -> None:
    raw = sample_report().to_dict()
    raw["schema_version"] = version
    with pytest.raises(SchemaVersionError) as caught:
        Report.from_dict(raw)
    said = str(caught.value)
    assert caught.value.version == version and isinstance(caught.value, ValueError)
    if type(version) is int and version in (1, 2):  # not read back since issue 25
        assert f"schema_version {version}, written by an older gpucheck" in said
        assert "run the command again" in said and "\n" not in said
    else:
        assert "unknown schema_version" in said


@pytest.mark.parametrize(
    ("requested", "output", "expected"),
    [(None, None, "text"), (None, "r.json", "json"), (None, "r.md", "markdown"),
     ("json", "r.md", "json"), (None, "r.log", "text"), (None, "report.html", "html"),
     (None, "REPORT.HTM", "html"), (None, "/var/lib/textfile/gpucheck.prom", "prometheus"),
     ("line", None, "line")],
)
def test_format_comes_from_the_flag_then_the_extension(requested: str | None,
                                                      output: str | None, expected: str) -> None:
    assert format_for(requested, output) == expected


def test_unknown_format_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="choose one of text, json, markdown"):
        format_for("yaml", None)


def test_write_atomic_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    write_atomic(str(target), "new contents\n")
    assert target.read_text() == "new contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert stat.S_IMODE(target.stat().st_mode) & 0o044  # readable by others, as umask allows


def test_unwritable_output_is_refused_before_any_work(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        check_writable(str(tmp_path / "missing" / "r.json"))
    with pytest.raises(UsageError, match="directory"):
        check_writable(str(tmp_path))
    # Root can write anywhere, so the permission check is exercised through os.access.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path
                        else real_access(path, mode))
    with pytest.raises(UsageError, match="not writable"):
        check_writable(str(tmp_path / "r.json"))


def test_skipped_checks_do_not_lower_an_ok_verdict() -> None:
    assert Report("env", [Section("s", "S", findings=[ok("gpu.numa", "m"), skip("gpu.busy", "m")])]
                  ).verdict() is Status.OK
    assert Report("env", [Section("s", "S", findings=[skip("gpu.busy", "m")])]
                  ).verdict() is Status.SKIP
    assert Report("env").verdict() is Status.OK


def test_byte_counts_read_in_binary_units_in_text_and_markdown() -> None:
    report = Report("env", [Section("s", "S", {"memory_total_bytes": 25276510208,
                                               "rows": [{"peak_memory_bytes": 3 * 2**20}]})])
    text = render(report, "text")
    assert "23.5 GiB" in text and "3.0 MiB" in text
    assert "| memory_total_bytes | 23.5 GiB |" in render(report, "markdown")
    assert json.loads(render(report, "json"))["sections"][0]["data"]["memory_total_bytes"] == \
        25276510208


@pytest.mark.parametrize(("fmt", "order"), [("text", ["zlate", "zdeep", "zcell"]),
                                            ("markdown", ["zlate", "m.zdeep", "m.t", "zcell"]),
                                            ("html", ["zlate", "zdeep", "zcell"])])
def test_every_format_shows_a_level_s_scalars_then_its_mappings_and_tables(
        fmt: str, order: list[str]) -> None:
    data = {"m": {"t": [{"c": "zcell"}], "zdeep": "x"}, "zlate": 5}
    page = render(Report("env", [Section("s", "S", data)]), fmt)
    at = [page.find(word) for word in order]
    assert -1 not in at and at == sorted(at)
