"""The HTML charts agree with the verdicts: a bar is red exactly where the section's own
threshold or its findings flag the rank, a baseline's floor is drawn where one judged,
comm's size axis is logarithmic, the fleet chart's node names stay inside the figure."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpucheck import subject
from gpucheck.analysis.baseline import Baseline, Expected
from gpucheck.commands.launch import baseline_section
from gpucheck.measure import Better, Metric
from gpucheck.render.chart_find import (
    BarSpec,
    LineSpec,
    RangeRow,
    RangeSpec,
    find_charts,
    flagged_ranks,
)
from gpucheck.render.charts import FLAGGED_COLOR
from gpucheck.report import Report, Section, Status, ok, warn
from gpucheck.stress.report import Verdicts, stress_sections

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
CPU_VERDICTS = Verdicts(peer_fraction=0.5, expected_fraction=0.8, copy_fraction=0.6)

matplotlib = pytest.importorskip("matplotlib")


def sample(name: str) -> Report:
    return Report.from_dict(json.loads((REPORTS / f"{name}.json").read_text()))


def cpu_stress(tflops: list[float]) -> Report:
    """A stress report through its real producer: CPU ranks on one node, fp32 GEMM."""
    ranks = [{"rank": r, "node_rank": 0, "host": "n0", "local_rank": r, "device": "cpu",
              "gpu": None, "gpu_name": None} for r in range(len(tflops))]
    gemm = [{"rank": r, "dtype": "fp32", "size": 512, "iters": 50, "tflops": t,
             "tflops_p50": t, "p50_ms": 1.0, "p99_ms": 2.0} for r, t in enumerate(tflops)]
    result = {"world_size": len(tflops), "device": "cpu", "backend": "gloo",
              "dtypes": ["fp32"], "size": 512, "duration_s": 1.0, "ranks": ranks,
              "gemm": gemm, "phases_planned": ["gemm"], "phases_done": ["gemm"]}
    return Report("stress", sections=stress_sections(result, CPU_VERDICTS))


def gemm_chart(report: Report) -> BarSpec:
    return next(s for s in find_charts(report) if isinstance(s, BarSpec) and "GEMM" in s.title)


def drawn(spec: Any) -> Any:
    """The matplotlib Figure the chart is drawn as (the same code the page uses)."""
    from matplotlib.figure import Figure

    from gpucheck.render import charts

    figure = (charts._draw_bars(spec) if isinstance(spec, BarSpec) else
              charts._draw_lines(Figure(), spec) if isinstance(spec, LineSpec) else
              charts._draw_ranges(spec))
    figure.savefig(io.StringIO(), format="svg")  # lays the figure out, as the page does
    return figure


def bar_colors(figure: Any) -> list[str]:
    from matplotlib.colors import to_hex

    return [to_hex(p.get_facecolor()) for p in figure.axes[0].patches]


# Rank 2 at 0.85x the median (the old charts painted it red), rank 4 at 0.4x.
FIVE_CPU_RANKS = [1.0, 1.0, 0.85, 1.0, 0.4]


def test_a_cpu_gemm_bar_at_0_85x_the_median_is_not_red_and_one_at_0_4x_is() -> None:
    report = cpu_stress(FIVE_CPU_RANKS)
    section = report.section("gemm")
    assert section is not None and section.data["peer_threshold"] == 0.5
    warned = [f.subject and f.subject.label for f in section.findings if f.status is Status.WARN]
    assert warned == ["rank 4"]  # the check, on CPU: below 0.5 x the median
    spec = gemm_chart(report)
    assert spec.flagged["fp32"] == {"rank 4"} == flagged_ranks(section)
    colors = bar_colors(drawn(spec))
    assert colors[4] == FLAGGED_COLOR and FLAGGED_COLOR not in colors[:4]


def test_the_chart_explains_red_and_draws_the_warn_line_from_the_threshold() -> None:
    spec = gemm_chart(cpu_stress(FIVE_CPU_RANKS))
    assert spec.rule.startswith("red: below 0.5 x its node's median")
    assert spec.limits["fp32"]["rank 2"] == pytest.approx(0.5 * 1.0)
    legend = [t.get_text() for t in drawn(spec).axes[0].get_legend().get_texts()]
    assert "WARN below 0.5 x node median" in legend and spec.rule in legend


def test_healthy_cpu_ranks_give_no_red_bar() -> None:
    spec = gemm_chart(cpu_stress([1.0, 0.8, 0.7]))
    assert spec.flagged["fp32"] == set()
    assert FLAGGED_COLOR not in bar_colors(drawn(spec))


def test_a_report_without_thresholds_in_its_data_colours_by_its_findings() -> None:
    report = sample("stress")  # written before the thresholds were kept in the data
    assert "peer_threshold" not in report.section("gemm").data
    assert gemm_chart(report).flagged == {"fp32": set(), "bf16": set()}


def test_bench_bars_are_the_metrics_and_red_exactly_for_the_ranks_the_check_named() -> None:
    """A rank subject names the rank by its field, whatever its words; the bars come from
    the section's metrics, not its display table."""
    report = Report("bench")
    metrics = [Metric("bench.images_per_s", "images/s", Better.HIGHER, v,
                      subject.rank(r, f"GPU {r} (bus 0000:1{r}:00.0)", gpu=r))
               for r, v in enumerate([100.0, 40.0, 39.0])]
    report.add(Section("timing", "T", {"ranks": [{"rank": 0, "images_per_s": 1.0}]},
                       [warn("bench.rank.straggler", "slow", hint="h",
                             subject=subject.rank(1, "GPU 1 (bus 0000:11:00.0)", gpu=1))],
                       metrics))
    spec = next(s for s in find_charts(report) if isinstance(s, BarSpec))
    assert spec.groups["timing"] == [("rank 0", 100.0), ("rank 1", 40.0), ("rank 2", 39.0)]
    assert spec.flagged["timing"] == {"rank 1"}  # not rank 2, lower but not judged slow
    assert bar_colors(drawn(spec))[1] == FLAGGED_COLOR != bar_colors(drawn(spec))[2]
    report.sections[0].findings = [ok("bench.rank.straggler", "fine")]
    assert next(s for s in find_charts(report) if isinstance(s, BarSpec)).flagged == {
        "timing": set()}


def with_baseline(report: Report, limits: dict[str, float]) -> Report:
    """`report` judged against a baseline holding `limits` (metric -> floor)."""
    baseline = Baseline(0.1, {name: Expected(limit / 0.9, limit, Better.HIGHER, "", 5, 0.0)
                              for name, limit in limits.items()})
    report.add(baseline_section(report, baseline))
    return report


def test_a_bench_under_a_baseline_draws_each_ranks_floor_and_none_without() -> None:
    report = sample("bench_slow")
    spec = next(s for s in find_charts(report) if isinstance(s, BarSpec))
    assert not any(spec.baseline.values())
    legend = [t.get_text() for t in drawn(spec).axes[0].get_legend().get_texts()]
    assert "baseline floor (--baseline)" not in legend
    ranks = report.section("timing").data["ranks"]
    floors = {f"bench.images_per_s.rank{r['rank']}": r["images_per_s"] * 1.2 for r in ranks}
    with_baseline(report, floors)
    assert any(f.status is Status.WARN for f in report.section("baseline").findings)
    spec = next(s for s in find_charts(report) if isinstance(s, BarSpec))
    assert spec.baseline["timing"] == {f"rank {r['rank']}": pytest.approx(
        r["images_per_s"] * 1.2) for r in ranks}
    legend = [t.get_text() for t in drawn(spec).axes[0].get_legend().get_texts()]
    assert "baseline floor (--baseline)" in legend


def test_comm_draws_the_baseline_floor_over_message_size_on_a_log_axis() -> None:
    report = sample("comm")
    rows = report.section("all_reduce").data["results"]
    with_baseline(report, {f"comm.all_reduce.busbw_gbps@{r['size_bytes']}": 1.0
                           for r in rows})
    spec = next(s for s in find_charts(report) if isinstance(s, LineSpec))
    assert [size for size, _ in spec.baseline["all_reduce"]] == [r["size_bytes"] for r in rows]
    axes = drawn(spec).axes[0]
    assert axes.get_xscale() == "log"
    assert "all_reduce: baseline floor" in [t.get_text() for t in axes.get_legend().get_texts()]


def test_the_fleet_charts_node_names_are_legible_and_inside_the_figure() -> None:
    long_name = "gpu-node-0417.rack12.cluster.example.com"
    spec = RangeSpec("Fleet", [
        RangeRow("bench.images_per_s.rank1", 100.0, 60.0, 140.0,
                 [("node-slow", 60.0), (long_name, 140.0)]),
        RangeRow("comm.all_reduce.busbw_gbps@1048576", 10.0, 9.0, 11.0)])
    figure = drawn(spec)
    renderer = figure._get_renderer()
    names = {t.get_text(): t for t in figure.axes[0].texts}
    assert set(names) == {"node-slow", long_name}
    for text in names.values():
        box = text.get_window_extent(renderer)
        assert text.get_fontsize() >= 8
        assert box.x0 >= 0 and box.x1 <= figure.bbox.x1 and box.y1 <= figure.bbox.y1
