"""Property tests (hypothesis): no report file and no option value makes a traceback.

A sample report with any part replaced by any JSON value gives exit 0, 1 or 2 (2 in one
line) and renders; every option parses to a finite number in range or is refused in one
line."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck.cli import build_parser, main
from gpucheck.commands import options
from gpucheck.commands.registry import BadOption
from gpucheck.render import render
from gpucheck.report import Report, ReportShapeError, SchemaVersionError

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
SAMPLES = ("bench.json", "comm.json", "stress_fail.json", "env_gpu.json")
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ODD_TEXT = st.lists(st.sampled_from(
    ["a", "Z", "9", "٣", "²", "|", "<", "/", "$", "\\", "`", "\n", "\x1b", "\x07", "\x9b",
     "\u202e", "\ud800", "\udfff", "é", "</details>", "$\\frac{1}{2}$", "\x00"]),
    max_size=8).map("".join)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**60), 2**64]), st.floats(allow_nan=True), ODD_TEXT,
    st.sampled_from(["OK", "FAIL", "WARN", "SKIP", "rerun", "drain-node", "2099-01-01T00:00:00"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(ODD_TEXT, inner, max_size=3)), max_leaves=8)


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [here] if here else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*here, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*here, index))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> None:
    for step in path[:-1]:
        value = value[step]
    value[path[-1]] = new


@st.composite
def damaged_reports(draw: st.DrawFn) -> str:
    """A sample report with one to three parts replaced by arbitrary JSON, as text."""
    raw = json.loads((REPORTS / draw(st.sampled_from(SAMPLES))).read_text())
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(raw)
        _replace(raw, draw(st.sampled_from(paths)), draw(JSON))
    return json.dumps(raw)  # ensure_ascii: a lone surrogate stays "\ud800" in the file


def _run(argv: list[str]) -> tuple[int, str]:
    """main(argv) with stdout and stderr captured; any exception fails the property."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    out.getvalue().encode("utf-8")  # whatever was printed can reach a UTF-8 terminal
    return code, err.getvalue()


def _check(argv: list[str]) -> None:
    code, err = _run(argv)
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err


@FUZZ
@given(damaged_reports(), st.sampled_from(SAMPLES))
def test_compare_of_any_damaged_report_exits_0_1_or_2(text: str, other: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        bad = Path(folder) / "bad.json"
        bad.write_text(text)
        _check(["compare", str(REPORTS / other), str(bad)])
        _check(["compare", str(bad), str(REPORTS / other), "--format", "markdown"])


@FUZZ
@given(st.lists(damaged_reports(), min_size=1, max_size=3),
       st.sampled_from(["text", "json", "markdown"]))
def test_fleet_of_damaged_reports_judges_the_rest_in_every_format(texts: list[str],
                                                                   fmt: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for i, text in enumerate(texts):
            (Path(folder) / f"node{i}.json").write_text(text)
        (Path(folder) / "good.json").write_text((REPORTS / "stress.json").read_text())
        code, err = _run(["fleet", folder, "--format", fmt])
        assert code in (0, 1), err  # good.json is always readable: never exit 2


BASELINE = {"kind": "gpucheck-baseline", "schema_version": 1, "tolerance": 0.1,
            "created_at": "2026-01-01T00:00:00+00:00", "source": {"reports": 1},
            "metrics": {"bench.images_per_s": {"expected": 100.0, "limit": 90.0,
                                               "direction": "higher", "unit": "img/s",
                                               "nodes": 3, "mad": 1.0}}}


@FUZZ
@given(st.data())
def test_any_damaged_baseline_is_used_or_refused_in_one_line(data: st.DataObject) -> None:
    raw = json.loads(json.dumps(BASELINE))
    _replace(raw, data.draw(st.sampled_from(_paths(raw))), data.draw(JSON))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "baseline.json"
        path.write_text(json.dumps(raw))
        _check(["fleet", str(REPORTS / "bench.json"), "--baseline", str(path)])


# --- options ------------------------------------------------------------------------

VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e309", "٣", "", " ", "1e-300",
                     str(10**30), "0x10", "1_000", "64K", "-1K", "infK", "\x1b[2J", "5%"]),
    st.floats().map(repr), st.integers().map(str), ODD_TEXT)


def _numeric_options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(name, action) for name, command in sub.choices.items()
            for action in command._actions
            if getattr(action, "type", None) is not None and action.option_strings]


OPTIONS = _numeric_options()


def test_every_numeric_option_of_every_command_is_typed() -> None:
    untyped = [(c, a.dest) for c, a in OPTIONS if a.type in (int, float)]
    assert OPTIONS and not untyped


@FUZZ
@given(st.sampled_from(OPTIONS), VALUES)
def test_every_option_parses_to_a_sound_value_or_refuses_in_one_line(
        option: tuple[str, argparse.Action], value: str) -> None:
    command, action = option
    positional = {"compare": ["a.json", "b.json"], "fleet": ["r.json"]}.get(command, [])
    argv = [command, *positional, f"{action.option_strings[0]}={value}"]
    try:
        args = build_parser().parse_args(argv)
    except BadOption as exc:
        assert "\n" not in str(exc) and "\x1b" not in str(exc)
        return
    parsed = getattr(args, action.dest)
    if isinstance(parsed, float):
        assert math.isfinite(parsed)
    if action.type in (options.positive_float, options.positive_int):
        assert parsed > 0
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        assert -options.MAX_COUNT <= parsed <= options.MAX_COUNT


@FUZZ
@given(st.sampled_from(["--threshold", "--mad-k", "--expect-nodes", "--nodes"]), VALUES)
def test_fleet_and_compare_options_end_in_0_1_or_2(option: str, value: str) -> None:
    _check(["fleet", str(REPORTS / "bench.json"), str(REPORTS / "bench_slow.json"),
            f"{option}={value}"])
    if option == "--threshold":
        _check(["compare", str(REPORTS / "bench.json"), str(REPORTS / "bench_slow.json"),
                f"--threshold={value}"])


@FUZZ
@given(damaged_reports())
def test_report_from_dict_reads_or_raises_its_own_errors_only(text: str) -> None:
    raw = json.loads(text)
    try:
        report = Report.from_dict(raw)
    except (ReportShapeError, SchemaVersionError):
        return
    for fmt in ("text", "markdown", "json"):
        render(report, fmt).encode("utf-8")
