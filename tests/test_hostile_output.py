"""Output that cannot be turned against its reader: terminal, Markdown, HTML charts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpucheck import subject
from gpucheck.cli import main
from gpucheck.render import render
from gpucheck.render.words import terminal
from gpucheck.report import Report, Section, fail, ok

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
# OSC 0 (window title), OSC 8 (hyperlink), clear screen, BEL, 8-bit CSI, a bidi override,
# and a newline that starts a forged report line.
HOSTILE = ("gpu01\x1b]0;owned\x07\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\\x1b[2J\x9b31m"
           "\u202eexe.txt\n  [ OK ] forged.check: all good")


def hostile_report() -> Report:
    data = {"host_name": HOSTILE, HOSTILE: "as a key",
            "rows": [{"node": HOSTILE, "value": 1}, {"node": "gpu02", "value": 2}]}
    return Report("env", [Section("s", f"Title {HOSTILE}", data,
                                   [fail("gpu.functional", f"msg {HOSTILE}", hint=f"hint {HOSTILE}",
                                         subject=subject.host(HOSTILE)), ok("gpu.numa", "fine")])],
                  argv=["gpucheck", "env"], host=HOSTILE, created_at="2026-01-01T00:00:00")


CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_terminal_escapes_controls_newlines_and_bidi_and_keeps_plain_text() -> None:
    assert terminal("gpu01.cluster: 8x H100 (80 GiB) ü") == "gpu01.cluster: 8x H100 (80 GiB) ü"
    shown = terminal(HOSTILE)
    assert not CONTROL.search(shown) and "\n" not in shown
    assert "\\x1b]0;owned\\x07" in shown and "\\u202e" in shown and "\\n" in shown
    assert terminal("\ud800") == "\\ud800"  # a lone surrogate can be printed


def test_the_text_report_has_no_control_character_and_no_forged_line() -> None:
    text = render(hostile_report(), "text")
    assert not CONTROL.search(text)
    lines = text.splitlines()
    # Findings start at column 2 ("  [FAIL] ..."), section titles at column 0: a wrapped
    # or escaped field never does (continuations are indented deeper).
    findings = [line for line in lines if line.startswith("  [")]
    assert len(findings) == 3  # the FAIL under Problems and in its section, the OK
    assert not any("forged" in line for line in findings)
    titles = [line for line in lines if line.startswith("== ")]
    assert len(titles) == 1 and titles[0].startswith("== Title gpu01\\x1b]0;owned")


def test_colour_codes_are_still_written_on_a_terminal() -> None:
    assert "\x1b[31;1m" in render(hostile_report(), "text", color=True)


def test_markdown_keeps_data_out_of_tables_folds_and_html() -> None:
    hostile = hostile_report()
    hostile.sections[0].findings[0] = fail("gpu.functional",
                                           "a | b\nc </details><img src=x> [l](u)", hint="h",
                                           subject=subject.file("</details>"))
    md = render(hostile, "markdown")
    assert not CONTROL.search(md)
    assert md.count("</details>") == md.count("<details>") == 1  # only the renderer's own
    assert "<img" not in md and "&lt;img src=x&gt;" in md and "\\[l\\](u)" in md
    for line in md.splitlines():
        if line.startswith("| FAIL") and "gpu.functional" in line:  # a finding row, its columns
            assert len(re.findall(r"(?<!\\)\|", line)) == 7


def test_html_report_escapes_controls_too() -> None:
    page = render(hostile_report(), "html")
    assert not CONTROL.search(page) and "<img" not in page


def test_stderr_quoting_a_report_field_is_escaped(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads((REPORTS / "bench.json").read_text())
    raw["command"] = "stress\x1b[2J\x1b]0;owned\x07\nFAKE LINE"
    other = tmp_path / "b.json"
    other.write_text(json.dumps(raw))
    assert main(["compare", str(REPORTS / "bench.json"), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err
    assert "\\x1b[2J" in err


def test_dollar_signs_in_fleet_names_are_text_in_the_chart_not_tex(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "reports"
    folder.mkdir()
    hosts = ["$\\frac{\\frac{1}{2}}{\\frac{3}{4}}$", "gpu02", "gpu03", "gpu04", "$x^2$"]
    for i, host in enumerate(hosts):  # the last one slow: an outlier, named in the chart
        raw = json.loads((REPORTS / "bench.json").read_text())
        raw["host"] = host
        for section in raw["sections"]:  # a little spread, so the chart has ranges
            for metric in section.get("metrics") or []:
                if metric["name"] == "bench.images_per_s":
                    metric["value"] *= 0.6 if host == "$x^2$" else 1 + i / 100
        (folder / f"n{i}.json").write_text(json.dumps(raw))
    out = tmp_path / "fleet.html"
    assert main(["fleet", str(folder), "-q", "-o", str(out)]) in (0, 1)
    page = out.read_text()
    chart = page[page.index("<svg"):page.index("</svg>")]
    assert ">$x^2$</text>" in chart  # the outlier's label as written, not typeset


def _saved_with(tmp_path: Path, **fields: object) -> str:
    raw = json.loads((REPORTS / "bench.json").read_text())
    raw.update(fields)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("fmt", ["text", "prometheus"])
def test_show_never_writes_a_scope_or_label_with_controls_or_bidi_raw(
        tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _saved_with(tmp_path, scope="\x1b]0;PWNED\x07\x00\u202escope", command="bench\x1b[2J")
    assert main(["show", path, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert not CONTROL.search(out.replace("\n", "")) and "\\x1b]0;PWNED" in out


def test_a_backtick_in_a_host_cannot_break_out_of_code_in_markdown(tmp_path: Path) -> None:
    from markdown_it import MarkdownIt

    report = Report("env", [Section("s", "S", {}, [ok("gpu.numa", "fine")])],
                    host="a`b ![t](http://evil/p.png) [l](http://evil/)", argv=["gpucheck"])
    page = MarkdownIt("commonmark").render(render(report, "markdown"))
    assert "<img" not in page and "<a href" not in page
    assert "![t](http://evil/p.png)" in page.replace("&amp;", "&")  # shown as text


def test_show_on_a_report_with_a_ten_megabyte_host_prints_it_cut_short(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _saved_with(tmp_path, host="h" * 10_000_000)
    assert main(["show", path]) == 0
    assert len(capsys.readouterr().out) < 100_000
