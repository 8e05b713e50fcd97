"""The text report as a person meets it: verdict and problems first, details, a closing
line; every line fits the terminal; section badges tell the truth."""

from __future__ import annotations

import re

import pytest

from gpucheck import subject
from gpucheck.render import render
from gpucheck.render.text import WIDTH, render_text, table_lines
from gpucheck.report import Report, Section, Status, fail, ok, skip, warn

ANSI = re.compile(r"\033\[[0-9;]*m")


def long_report() -> Report:
    """Many OK sections, wide data and a wide table, the problems deep inside."""
    report = Report(command="all", argv=["gpucheck", "all"], host="node7")
    for n in range(20):
        report.add(Section(f"s{n}", f"Section {n}", {f"key_{k}": "value " * 5 for k in range(8)},
                           [ok("gpu.numa", "fine") for k in range(5)]))
    report.add(Section("environment", "Environment", {"variables": {
        "PATH": ":".join(f"/opt/tool{n}/bin" for n in range(30))}}))
    rows = [{f"column_{c}": f"rank{r}-value-{c}" for c in range(12)} for r in range(4)]
    report.add(Section("ranks", "Ranks", {"ranks": rows}, [
        warn("bench.rank.straggler", "rank 3 ran 1.31x the other ranks' pace " + "x" * 150,
             "look at rank 3's GPU clocks and the processes sharing it",
             subject.rank(3, "rank 3 on node7")),
    ]))
    report.add(Section("xid", "Kernel log", {}, [
        fail("kernel_log.xid", "GPU has fallen off the bus", "drain the node and reseat",
             subject.gpu(1, "GPU 1 (NVIDIA H200, bus 00000000:28:00.0)",
                         bus_id="00000000:28:00.0"))]))
    return report


def test_text_report_opens_with_the_verdict_and_the_problems_failures_first() -> None:
    lines = render_text(long_report()).splitlines()
    assert lines[0].startswith("gpucheck all on node7 at ") and ": FAIL (" in lines[0]
    assert lines[2] == "Problems (1 FAIL, 1 WARN):"
    assert "[FAIL] kernel_log.xid (GPU 1" in lines[3]
    warn_line = next(i for i, line in enumerate(lines) if "[WARN] bench.rank.straggler" in line)
    assert warn_line < 12, "the WARN must be on the first screen, not hundreds of lines down"
    assert any("HINT (drain-node): drain the node and reseat" in line for line in lines[3:6])


@pytest.mark.parametrize("width", [WIDTH, 80, 60])
def test_every_line_fits_the_width_keeping_every_word_and_no_table_in_blocks(width: int) -> None:
    text = render_text(long_report(), width=width)
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert too_wide == []
    headers = [line for line in text.splitlines() if line.split()[:2] == ["column_0", "column_1"]]
    assert len(headers) <= 1  # one header (or the table row by row), never a second block
    joined = "".join(line.strip() for line in text.splitlines())  # a long message and path
    assert "x" * 150 in joined and ":".join(f"/opt/tool{n}/bin" for n in range(30)) in joined


def test_a_table_that_fits_wraps_and_one_a_little_too_wide_leaves_out_its_rightmost() -> None:
    rows = [{"figure": "all_reduce busbw", "value": "1.234", "unit": "GB/s",
             "where": "at 1 GiB; rank 3 on node7; median 1.5 of 8 ranks, measured again"}]
    lines = table_lines(rows, "  ", 60)
    assert lines[0].split() == ["figure", "value", "unit", "where"]
    assert all(len(line) <= 60 for line in lines) and len(lines) > 2  # "where" wraps
    assert "left out" not in "\n".join(lines)
    rows = [{f"column_{c}": f"rank{r}-value-{c}" for c in range(8)} for r in range(2)]
    lines = table_lines(rows, "  ", 100)
    assert lines[0].split() == [f"column_{c}" for c in range(6)]
    assert " ".join(" ".join(lines[3:]).split()) == (
        "(left out at 100 columns, rightmost first: column_6, column_7; every column is in "
        "the JSON, Markdown and HTML reports)")
    rows = [{"rank": 1, "node": "node-slow", "status": "WARN", "reason": "x" * 60,
             "all_actions": "rerun, drain-node"}]
    lines = table_lines(rows, "", 60)  # the key columns stay, under one header
    headers = [line for line in lines if line.startswith("rank")]
    assert len(headers) == 1 and headers[0].split()[:2] == ["rank", "node"]
    assert "left out at 60 columns, rightmost first: reason, all_actions" in " ".join(lines)
    assert all(len(line) <= 60 for line in lines)


def test_a_table_that_would_lose_half_its_columns_is_shown_row_by_row() -> None:
    text = render_text(long_report(), width=60)
    joined = " ".join(text.split())
    for r in range(4):
        row = "; ".join(f"column_{c} rank{r}-value-{c}" for c in range(1, 12))
        assert f"column_0 rank{r}-value-0: {row}" in joined


def test_colour_paints_tags_and_verdict_without_changing_the_layout() -> None:
    report = long_report()
    plain = render_text(report)
    painted = render_text(report, color=True)
    assert "\033[31;1m[FAIL]\033[0m" in painted
    assert ANSI.sub("", painted) == plain


@pytest.mark.parametrize(
    ("findings", "badge"),
    [([ok("gpu.numa", "m"), skip("gpu.busy", "n/a")], Status.OK),
     ([skip("gpu.numa", "n/a"), skip("gpu.busy", "n/a")], Status.SKIP),
     ([ok("gpu.numa", "m"), skip("gpu.busy", "n/a"), warn("gpu.mig_mode", "m", "h")],
      Status.WARN),
     ([warn("gpu.mig_mode", "m", "h"), fail("gpu.functional", "m", "h"),
       skip("gpu.busy", "n/a")], Status.FAIL),
     ([], None)],
)
def test_section_badge_is_worst_problem_else_ok_when_measured_skip_only_if_all_skipped(
        findings: list, badge: Status | None) -> None:
    section = Section("s", "S", {"x": 1}, findings)
    assert section.verdict() is badge
    report = Report("env", [section])
    label = badge.value if badge else "info"
    assert f"<b>S</b> ({label})" in render(report, "markdown")
    assert f'<span class="badge s-{label}">{label}</span>' in render(report, "html") or \
        (badge is None and ">info</span>" in render(report, "html"))
    header = "== S ==" if badge is None else f"== S ({badge.value}) =="
    assert header in render(report, "text")


def test_html_keeps_problem_sections_open_and_folds_the_rest() -> None:
    report = Report("env", [Section("good", "Good", {}, [ok("gpu.numa", "m")]),
                            Section("bad", "Bad", {}, [warn("gpu.busy", "m", "h")])])
    html = render(report, "html")
    assert '<details id="good">' in html
    assert '<details open id="bad">' in html


def test_env_without_gpu_or_driver_says_so_and_with_gpus_claims_no_scope(monkeypatch) -> None:
    import sys

    from gpucheck.probes.runner import NO_GPU_SCOPE, collect_env_report
    from tests.fake_pynvml import FakeGpu, FakeNvml

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML library: no driver
    monkeypatch.setattr("gpucheck.probes.gpus.nvidia_pci_devices", lambda *a, **k: 0)
    bare = collect_env_report(gpu_test=False, environ={})
    assert bare.scope == NO_GPU_SCOPE
    fake = FakeNvml([FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(2)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with_gpus = collect_env_report(gpu_test=False, environ={})
    assert with_gpus.scope is None


def test_cpu_ranks_within_the_cores_stay_ok_and_more_ranks_than_cores_warn_naming_them() -> None:
    from gpucheck.commands.launch import LaunchPlan, cpu_ranks_finding

    fits = cpu_ranks_finding(LaunchPlan(2, "cpu", "gloo", None, 60.0), cores=2)
    assert fits is not None and fits.status is Status.OK
    crowded = cpu_ranks_finding(LaunchPlan(8, "cpu", "gloo", None, 60.0), cores=2)
    assert crowded is not None and crowded.status is Status.WARN
    assert "8 CPU rank(s) on 2 usable core(s)" in crowded.message
    assert "--n-gpus 2" in crowded.hint and crowded.action == "fix-config"
    assert cpu_ranks_finding(LaunchPlan(8, "cuda", "nccl", None, 60.0), cores=2) is None


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "line", "json", "prometheus"])
def test_a_report_on_cpu_ranks_says_so_first_in_every_format(fmt: str) -> None:
    from gpucheck.commands.launch import CPU_SCOPE, LaunchPlan, add_launch_finding

    figures = Section("stress", "Stress", {"device": "cpu"}, [ok("stress.gemm.peers", "ok")])
    report = add_launch_finding(Report("stress", [figures]),
                                LaunchPlan(2, "cpu", "gloo", None, 60.0))
    assert report.scope == CPU_SCOPE
    shown = render(report, fmt)
    said = shown.find(CPU_SCOPE.split(":")[0])
    after = [i for i in (shown.find("stress.gemm"), shown.find("Stress"), shown.find("OK:"))
             if i >= 0]
    assert 0 <= said < min(after, default=len(shown)), shown
    if fmt == "text":
        assert shown.splitlines()[1] == f"Scope: {CPU_SCOPE}"
    assert Report.from_dict(report.to_dict()).scope == CPU_SCOPE
    on_gpu = add_launch_finding(Report("stress", [figures]),
                                LaunchPlan(2, "cuda", "nccl", None, 60.0))
    assert on_gpu.scope is None


def test_all_shows_the_fault_watch_thresholds_once_and_points_back_to_them() -> None:
    from gpucheck.commands.all import combined_report
    from gpucheck.context import Outcome

    thresholds = {"temperature_c": 90, "xid": "any"}

    def faulted(command: str) -> Report:
        return Report(command, [Section("faults", "Fault watch",
                                        {"thresholds": thresholds, "gpus": 1},
                                        [ok("faults.summary", "none")])])

    other = {"thresholds": {"temperature_c": 80}}
    reports = [faulted("stress"), faulted("bench"),
               Report("comm", [Section("faults", "Fault watch", other)])]
    combined = combined_report([Outcome(r.command, "ran", "", 1.0, r) for r in reports])
    data = {s.name: s.data for s in combined.sections}
    assert data["stress.faults"]["thresholds"] == thresholds
    assert data["bench.faults"]["thresholds"] == "as in stress: Fault watch"
    assert data["comm.faults"]["thresholds"] == {"temperature_c": 80}  # differs: shown
    assert reports[1].sections[0].data["thresholds"] == thresholds  # the input is kept


def test_a_table_of_rows_without_fields_renders_as_nothing_not_a_crash() -> None:
    # Found by test_hostile_fuzz: a damaged report's `"model": [{}]`.
    assert table_lines([{}], "  ", 40) == []
    assert table_lines([{}, {}], "", 100) == []
