"""Renderers: one `Report` in, text / JSON / Markdown / HTML out, or for machines one
line (a drain reason) or Prometheus text, for every command. They never probe.
"""

from __future__ import annotations

from pathlib import Path

from gpucheck.errors import UsageError
from gpucheck.report import Report

FORMATS = ("text", "json", "markdown", "markdown-plain", "html", "line", "prometheus")
EXTENSIONS = {".txt": "text", ".log": "text", ".json": "json", ".md": "markdown",
               ".markdown": "markdown", ".html": "html", ".htm": "html",
               ".prom": "prometheus"}


def format_for(requested: str | None, output: str | None) -> str:
    """The format asked for, else the one the output file's extension implies, else text."""
    if requested is not None:
        if requested not in FORMATS:
            raise UsageError(
                f"unknown --format {requested!r}: choose one of {', '.join(FORMATS)}"
            )
        return requested
    if output is not None:
        return EXTENSIONS.get(Path(output).suffix.lower(), "text")
    return "text"


def render(report: Report, fmt: str, color: bool = False, width: int | None = None) -> str:
    """The report as a string in `fmt` (one of FORMATS); `width` (text only): the
    terminal's columns, else the text renderer's default."""
    if fmt in ("json", "line", "prometheus"):
        from gpucheck.render import headline

        machine = {"json": headline.render_json, "line": headline.render_line,
                   "prometheus": headline.render_prometheus}
        return machine[fmt](report)
    if fmt in ("markdown", "markdown-plain"):
        from gpucheck.render.markdown import render_markdown

        return render_markdown(report, plain=fmt == "markdown-plain")
    if fmt == "html":
        from gpucheck.render.html import render_html

        return render_html(report)
    from gpucheck.render.text import WIDTH, render_text

    return render_text(report, color=color, width=WIDTH if width is None else width)
