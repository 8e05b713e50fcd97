"""The Markdown reports through markdown-it-py, with GitHub's table extension and without
it, as a ticket system that renders no tables shows them (issue 27, item 7)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from gpucheck.render import render
from gpucheck.report import Report

REPORTS = Path(__file__).parent / "data" / "reports"
NAMES = ["env", "bench", "stress_fail", "comm_failed"]


def saved(name: str) -> Report:
    return Report.from_dict(json.loads((REPORTS / f"{name}.json").read_text()))


def commonmark(text: str, tables: bool) -> str:
    md = MarkdownIt("commonmark")
    return md.enable("table").render(text) if tables else md.render(text)


def paragraphs(rendered: str) -> list[str]:
    return [html.unescape(p) for p in re.findall(r"<p>(.*?)</p>", rendered, re.S)]


@pytest.mark.parametrize("name", NAMES)
def test_github_markdown_tables_render_as_tables_where_tables_are_supported(name: str) -> None:
    rendered = commonmark(render(saved(name), "markdown"), tables=True)
    assert "<table>" in rendered
    assert not [p for p in paragraphs(rendered) if p.lstrip().startswith("|")]


def test_github_markdown_without_table_support_shows_raw_pipes() -> None:
    # What the README warns of: elsewhere, use --format markdown-plain.
    rendered = commonmark(render(saved("stress_fail"), "markdown"), tables=False)
    assert "<table>" not in rendered
    assert [p for p in paragraphs(rendered) if p.lstrip().startswith("|")]


@pytest.mark.parametrize("name", NAMES)
def test_plain_markdown_reads_the_same_with_and_without_table_support(name: str) -> None:
    text = render(saved(name), "markdown-plain")
    with_tables, without = commonmark(text, tables=True), commonmark(text, tables=False)
    assert with_tables == without  # nothing in it depends on the table extension
    assert "<table>" not in without
    assert not [p for p in paragraphs(without) if p.lstrip().startswith("|")]
    assert "<pre><code>" in without
    assert not re.search(r"<(details|summary|b)>", without)  # no HTML outside code


def test_plain_markdown_keeps_every_finding_id_readable_without_tables() -> None:
    report = saved("stress_fail")
    shown = html.unescape(commonmark(render(report, "markdown-plain"), tables=False))
    for section in report.sections:
        for finding in section.findings:
            assert finding.check in shown
