"""`gpucheck show REPORT.json` and `-o` given more than once (issue 27, item 1), and the
"did you mean" of a mistyped command or option (item 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.cli import main

REPORTS = Path(__file__).parent / "data" / "reports"


def test_show_renders_a_saved_report_as_markdown_with_its_verdict_and_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ticket.md"
    assert main(["show", str(REPORTS / "stress_fail.json"), "-o", str(out), "-q"]) == 0
    text = out.read_text()
    assert text.startswith("# gpucheck stress: **FAIL**")
    assert "stress.sdc.repeat" in text and "## Figures" in text
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("fmt", ["text", "markdown", "markdown-plain", "html", "json", "line",
                                 "prometheus"])
def test_show_renders_every_format_of_every_saved_command(
        fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("env", "bench", "comm", "stress", "comm_failed"):
        assert main(["show", str(REPORTS / f"{name}.json"), "--format", fmt]) == 0
        assert capsys.readouterr().out.strip()


def test_show_json_round_trips_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(REPORTS / "bench.json"), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    original = json.loads((REPORTS / "bench.json").read_text())
    # schema 3 in, schema 3 out: every section, metric and finding as the file holds it.
    assert shown["sections"] == original["sections"]
    assert shown["verdict"] == original["verdict"]


@pytest.mark.parametrize("name", ["malformed.json", "not_a_report.json", "unknown_schema.json",
                                  "bench_v1.json", "missing.json"])
def test_show_refuses_a_bad_file_in_one_line_with_exit_2(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(REPORTS / name)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and name in captured.err


def test_show_refuses_a_directory_and_writes_nothing(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.md"
    assert main(["show", str(tmp_path), "-o", str(out)]) == 2
    assert not out.exists()


def test_output_given_twice_writes_both_files_each_in_its_own_format(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node, ticket, page = tmp_path / "node.json", tmp_path / "ticket.md", tmp_path / "p.html"
    assert main(["show", str(REPORTS / "bench.json"), "-o", str(node), "-o", str(ticket),
                 "-o", str(page), "-q"]) == 0
    assert json.loads(node.read_text())["command"] == "bench"
    assert ticket.read_text().startswith("# gpucheck bench:")
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_one_output_still_takes_the_format_option(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.txt"
    assert main(["show", str(REPORTS / "env.json"), "--format", "json", "-o", str(out),
                 "-q"]) == 0
    assert json.loads(out.read_text())["command"] == "env"


def test_the_same_file_named_twice_is_a_usage_error(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.md"
    assert main(["show", str(REPORTS / "env.json"), "-o", str(out), "-o", str(out)]) == 2
    assert not out.exists()


def test_an_unwritable_second_output_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "a.json"
    assert main(["show", str(REPORTS / "env.json"), "-o", str(first),
                 "-o", str(tmp_path / "no" / "b.md")]) == 2
    assert not first.exists()


@pytest.mark.parametrize(("argv", "meant", "helped"), [
    (["benhc"], "'bench'", "gpucheck bench --help"),
    (["bench", "--itres", "3"], "'--iters'", "gpucheck bench --help"),
    (["stress", "--duraton", "2"], "'--duration'", "gpucheck stress --help"),
])
def test_a_mistyped_command_or_option_gets_did_you_mean_and_its_help(
        argv: list[str], meant: str, helped: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"did you mean {meant}" in err and f"(see {helped})" in err


def test_bench_dtype_fp64_is_refused_before_torch_is_imported() -> None:
    code = ("import sys; from gpucheck.cli import main; rc = main(['bench', '--dtype', "
            "'fp64']); print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.stdout.split() == ["2", "False"]
    assert "--dtype" in proc.stderr and "fp64" in proc.stderr
