"""Escaping of report fields for the place they land: a terminal, a ticket, a browser.

A report's values come from the machine (host names, environment variables, kernel
log lines, file names) or from report files of other machines: input, never markup
or terminal commands. Each renderer passes every field it writes through one of
these functions, so a value shows as text:

- `terminal`: C0/C1 control characters (ESC starts colour, clear-screen and OSC
  title or hyperlink sequences, ECMA-48; BEL; 0x9b is an 8-bit CSI), DEL, Unicode
  bidirectional overrides (CVE-2021-42574, "Trojan Source") and lone surrogates are
  written as Python-style escapes (`\\x1b`, `\\n`, `\\u202e`): a newline in a field
  cannot start a forged line of the report, and stdout never fails to encode.
- `markdown`: the same, then `&`, `<`, `>` as entities (GitHub renders raw HTML:
  `</details>` would end the fold, `<img src=...>` would load a tracker) and
  `\\ | [ ] `` ` `` backslash-escaped (a `|` ends a table cell, `[..](..)` makes a link).
- `html`: the same control escaping, then `html.escape` (quotes too).
"""

from __future__ import annotations

import html as _html
import re

from gpucheck.escape import terminal

__all__ = ["html", "markdown", "markdown_code", "shown", "terminal"]

# One field on a terminal: a host name is at most 253 characters and a message a few
# hundred; a field of megabytes (a hostile report) would take textwrap minutes.
FIELD_MAX = 4096

_MD_SPECIAL = re.compile(r"([\\`|\[\]])")
_MD_ANY = re.compile(r"[\\`|\[\]&<>]")


def markdown(value: object) -> str:
    """`value` as literal text in a Markdown table cell or paragraph."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable() and not _MD_ANY.search(text):
        return text  # the usual cell: nothing to escape
    # Markdown escapes first, on the raw text; then controls as `\n`, which Markdown
    # shows as written (a backslash before a letter escapes nothing).
    return terminal(_MD_SPECIAL.sub(r"\\\1", _html.escape(text, quote=False)))


def markdown_code(value: object) -> str:
    """`value` as inline code: a code span shows `<` and `*` as they are; with a
    backtick in it (which would end the span) as HTML <code>, its text escaped as any
    Markdown text (Markdown still applies inside an HTML tag: `![t](url)` would load)."""
    text = terminal(value)
    if "`" not in text:
        return f"`{text}`"
    return f"<code>{markdown(text)}</code>"


def shown(value: object) -> str:
    """`terminal(value)` for the text report, cut at FIELD_MAX characters (the whole
    value stays in the JSON report)."""
    text = terminal(value)
    if len(text) <= FIELD_MAX:
        return text
    return f"{text[:FIELD_MAX]}... ({len(text) - FIELD_MAX} more characters in the JSON report)"


def html(value: object) -> str:
    """`value` as HTML text or an attribute value."""
    return _html.escape(terminal(value))
