"""`--format html`: one self-contained page per report, escaped, with the problems
first and charts where matplotlib is installed (notes where it is not)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from html import escape
from pathlib import Path
from typing import Any

import pytest

from gpucheck import subject
from gpucheck.cli import main
from gpucheck.render import charts as charts_module
from gpucheck.render import render
from gpucheck.render.chart_find import ChangeSpec, LineSpec, RangeSpec, find_charts
from gpucheck.render.charts import INSTALL_NOTE
from gpucheck.report import Report, Section, fail, ok, warn

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
# Files of tests/data/reports that are reports this gpucheck reads.
SAMPLES = ["env", "env_gpu", "env_gpu_old_driver", "bench", "bench_slow", "comm",
           "comm_failed", "stress", "stress_fail"]
# Anything a browser could fetch: a scheme-qualified or protocol-relative address.
NETWORK = re.compile(r"https?:|(src|href)\s*=\s*[\"']?//", re.IGNORECASE)


def sample(name: str) -> Report:
    return Report.from_dict(json.loads((REPORTS / f"{name}.json").read_text()))


def run_report(tmp_path: Path, *argv: str) -> Report:
    out = tmp_path / "report.json"
    main([*argv, "-o", str(out), "-q"])
    return Report.from_dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return run_report(tmp_path_factory.mktemp("fleet"), "fleet", str(REPORTS))


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return run_report(tmp_path_factory.mktemp("compare"), "compare",
                      str(REPORTS / "bench.json"), str(REPORTS / "bench_slow.json"))


@pytest.fixture()
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import matplotlib` raises ImportError, as where the html extra is not installed."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def assert_offline(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert not NETWORK.search(page), NETWORK.search(page)
    assert "<script" not in page.lower()
    assert "<link" not in page.lower() and "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # url(#clip-id) is the page's own


@pytest.mark.parametrize("name", SAMPLES)
def test_every_sample_report_renders_to_a_page_that_fetches_nothing_without_torch(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # compare and fleet run without torch
    page = render(sample(name), "html")
    assert_offline(page)
    for section in sample(name).sections:
        assert f'id="{section.name}"' in page


def test_fleet_and_compare_reports_render_to_pages_that_fetch_nothing_without_torch(
        fleet_report: Report, compare_report: Report, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    for report in (fleet_report, compare_report):
        page = render(report, "html")
        assert_offline(page)
        assert "Nodes to act on" in page or "Metrics (B against A" in page


def hostile_report() -> Report:
    evil = "<script>alert(1)</script>"
    report = Report("env", host=f"node{evil}", argv=["gpucheck", evil])
    report.add(Section("environment", f"Env {evil}",
                       data={"variables": {"EVIL": f'"><img src=x onerror=alert(2)>{evil}'},
                             "rows": [{"name": evil, "status": "FAIL"}]},
                       findings=[fail("system.shm", f"message {evil}", f"hint {evil}",
                                      subject=subject.host(evil))]))
    return report


def test_a_hostile_hostname_message_and_value_are_escaped_not_markup() -> None:
    page = render(hostile_report(), "html")
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "message &lt;script&gt;" in page and "hint &lt;script&gt;" in page
    assert "node&lt;script&gt;" in page.split("<body>", 1)[1].split("</h1>", 1)[1]


def test_the_problems_table_comes_first_with_status_action_and_hint() -> None:
    page = render(sample("stress_fail"), "html")
    problems = page.index("<h2>Problems</h2>")
    assert problems < page.index("<details")
    table = page[problems:].split("</table>", 1)[0]
    header = re.findall(r"<th>(\w+)</th>", table.split("</tr>", 1)[0])
    assert header == ["status", "action", "check", "subject", "message", "hint"]
    assert '<td class="s-FAIL">FAIL</td><td>drain-node</td><td>stress.sdc.repeat</td>' in table


def test_a_report_without_problems_says_so() -> None:
    report = Report("env")
    report.add(Section("s", "S", findings=[ok("gpu.numa", "fine")]))
    page = render(report, "html")
    assert "No FAIL or WARN findings." in page
    assert '<span class="badge s-OK">OK</span>' in page


def test_data_renders_as_key_value_rows_nested_lists_and_tables() -> None:
    report = Report("env")
    report.add(Section("s", "S", data={
        "memory_total_bytes": 2 * 2**30, "nested": {"inner": {"deep": 7}},
        "rows": [{"rank": 0, "status": "WARN"}, {"rank": 1, "extra": "x"}]},
        findings=[warn("gpu.busy", "slow", "look")]))
    page = render(report, "html")
    assert "<tr><th>memory_total_bytes</th><td>2.0 GiB</td></tr>" in page
    assert '<ul class="tree"><li>inner:<ul class="tree"><li>deep: 7</li></ul></li></ul>' in page
    assert "<tr><th>rank</th><th>status</th><th>extra</th></tr>" in page
    assert '<td class="s-WARN">WARN</td><td>n/a</td>' in page


def test_the_cli_writes_an_html_output_file_as_html(tmp_path: Path) -> None:
    out = tmp_path / "compare.html"
    code = main(["compare", str(REPORTS / "bench.json"), str(REPORTS / "bench_slow.json"),
                 "-o", str(out), "-q"])
    assert code == 1
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "compare.regression" in page


def test_comm_charts_busbw_per_collective_over_message_size() -> None:
    spec = next(s for s in find_charts(sample("comm")) if isinstance(s, LineSpec))
    assert list(spec.series) == ["all_reduce", "all_gather"]
    sizes = [size for size, _ in spec.series["all_reduce"]]
    assert sizes == sorted(sizes) and sizes[0] == 1024 and sizes[-1] == 65536


def test_sections_of_a_combined_report_are_found_by_their_last_dotted_name() -> None:
    combined = Report("all")
    for name in ("comm", "stress"):
        for section in sample(name).sections:
            section.name = f"{name}.{section.name}"
            combined.add(section)
    kinds = [type(s).__name__ for s in find_charts(combined)]
    assert kinds == ["LineSpec", "BarSpec", "BarSpec"]


def test_the_fleet_chart_marks_the_outlier_node_on_its_metric(fleet_report: Report) -> None:
    spec = next(s for s in find_charts(fleet_report) if isinstance(s, RangeSpec))
    if importlib.util.find_spec("matplotlib"):  # drawn where matplotlib is installed
        page = render(fleet_report, "html")
        assert page.count("<svg") == 1 and "node-slow" in page.split("<svg", 1)[1]
    # node-slow's rank 1 is slower on the wall clock and in its own pace (a slow device).
    marked = {row.label: [node for node, _ in row.outliers] for row in spec.rows
              if row.outliers}
    assert marked == {"bench.images_per_s.rank1": ["node-slow"],
                      "bench.iteration_p50_ms.rank1": ["node-slow"]}


def test_the_compare_chart_shows_each_metrics_change_worse_first(compare_report: Report) -> None:
    (spec,) = find_charts(compare_report)
    assert isinstance(spec, ChangeSpec)
    verdicts = [verdict for _, _, verdict in spec.rows]
    # rank 1 slower on the wall clock and in its pace (+66.7% ms per iteration too).
    assert verdicts == ["worse"] * 5 + ["same"] * 3
    assert spec.rows[0][:2] in (("bench.job_wall_s", 66.7),
                                ("bench.iteration_p50_ms.rank1", 66.7))


def test_an_env_report_has_no_charts_and_no_install_note(no_matplotlib: None) -> None:
    assert find_charts(sample("env_gpu")) == []
    assert escape(INSTALL_NOTE) not in render(sample("env_gpu"), "html")


@pytest.mark.parametrize("bad", [None, "fast", True, float("nan"), float("inf"), [1]])
def test_values_that_are_not_finite_numbers_give_no_chart(bad: Any) -> None:
    report = Report("bench")
    report.add(Section("timing", "T", data={"ranks": [{"rank": 0, "images_per_s": bad}]}))
    report.add(Section("all_reduce", "A", data={"results": [
        {"size_bytes": 1024, "busbw_gbps": bad}, {"size_bytes": bad, "busbw_gbps": 1.0}]}))
    assert find_charts(report) == []
    assert_offline(render(report, "html"))


def test_without_matplotlib_the_page_keeps_its_tables_and_says_how_to_get_charts(
        no_matplotlib: None) -> None:
    page = render(sample("comm"), "html")
    assert "<svg" not in page
    assert escape(INSTALL_NOTE) in page
    assert "<th>busbw_gbps</th>" in page and "Problems" in page


def test_a_chart_that_fails_to_draw_is_left_out_with_a_note(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in module: the import succeeds, whatever matplotlib is installed here.
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))

    def broken(spec: Any, salt: str) -> str:
        raise ValueError("no room\nsecond line")

    monkeypatch.setattr(charts_module, "_draw", broken)
    page = render(sample("stress"), "html")
    assert page.count("chart left out (ValueError: no room)") == 2
    assert "second line" not in page and "<th>tflops</th>" in page


def test_with_matplotlib_the_comm_page_holds_an_inline_svg_chart() -> None:
    pytest.importorskip("matplotlib")
    page = render(sample("comm"), "html")
    assert page.count("<svg") == 1
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert "all_reduce" in svg and "all_gather" in svg and "64 KiB" in svg
    assert_offline(page)


def test_with_matplotlib_two_charts_on_one_page_share_no_element_id() -> None:
    pytest.importorskip("matplotlib")
    page = render(sample("stress"), "html")
    svgs = re.findall(r"<svg.*?</svg>", page, re.DOTALL)
    assert len(svgs) == 2
    ids = [set(re.findall(r'\bid="([^"]+)"', svg)) for svg in svgs]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    for svg, own in zip(svgs, ids, strict=True):  # every reference stays in its chart
        assert set(re.findall(r'(?:href="|url\()#([^")]+)', svg)) <= own
