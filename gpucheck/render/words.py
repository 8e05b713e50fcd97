"""A report's values in words for every renderer: a finding's second look, figures and
tables, each field escaped for where it lands (docs/html.md, "Escaping")."""

from __future__ import annotations

import html as _html
import re
from collections.abc import Callable
from typing import Any, TypeVar

from gpucheck.escape import terminal as terminal
from gpucheck.measure import LookState, SecondLook
from gpucheck.report import Finding, Status
from gpucheck.stats import fmt_bytes as fmt_bytes

# What an unstable look asks of a person, once for every command.
UNSTABLE_ADVICE = ("not slow the second time: contention from other jobs or a transient; "
                   "run again, and act only if it repeats")


def look_words(look: SecondLook, advice: bool = True) -> str:
    """"confirmed: measured again at 41 GB/s beside rank 2 -> rank 5 (reference 80 GB/s)",
    a clause per part; `advice`: an unstable look's "run again"."""
    beside = f" beside {', '.join(s.label for s in look.against)}" if look.against else ""
    reference = f" (reference {fmt_value(look.reference)} {look.unit}".rstrip() + ")" \
        if look.reference is not None else ""
    if look.state is LookState.NOT_MEASURED:
        words = f"not measured again ({look.why_not})" if look.why_not \
            else "not measured again"
    elif look.again is None:  # a shared node: the parts carry the figures
        words = look.state.value
    else:
        words = f"{look.state.value}: measured again at " \
                f"{fmt_value(look.again)} {look.unit}".rstrip() + f"{beside}{reference}"
    if look.parts:
        words += " [" + "; ".join(look_words(p) for p in look.parts) + "]"
    if look.state is LookState.UNSTABLE and advice:
        words += f"; {UNSTABLE_ADVICE}"
    return words


def message_words(finding: Finding) -> str:
    """The message, then the second look in words when the finding has one."""
    if finding.look is None:
        return finding.message
    return f"{finding.message}; {look_words(finding.look, finding.status.value != 'OK')}"


def problems(findings: list[Finding]) -> list[Finding]:
    """Every FAIL, then every WARN, each group in report order."""
    found = [f for f in findings if f.status in (Status.FAIL, Status.WARN)]
    return sorted(found, key=lambda f: -f.status.severity)


def finding_rows(findings: list[Finding], narrow: bool = False) -> list[dict[str, Any]]:
    """Rows of a findings table; `narrow`: an action column only if a finding has one."""
    with_action = not narrow or any(f.action for f in findings)
    return [{"status": f.status.value, **({"action": f.action or ""} if with_action else {}),
             "check": f.check, "subject": f.subject.label if f.subject else "",
             "message": message_words(f), "hint": f.hint or ""} for f in findings]


def fmt_value(value: Any) -> str:
    """A short human form: None is n/a, floats keep about four significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
    if isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(fmt_value(v) for v in value) if value else "-"
    return str(value)


def fmt_field(key: str, value: Any) -> str:
    """Like fmt_value, but byte counts (keys ending in `_bytes`) read as KiB/MiB/GiB/TiB."""
    if key.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        return fmt_bytes(value)
    return fmt_value(value)


def is_table(value: Any) -> bool:
    """A non-empty list of dicts renders as a table."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


T = TypeVar("T")


def walk(data: dict[str, Any], fields: Callable[[tuple[str, ...], dict[str, Any]], list[T]],
         branch: Callable[[tuple[str, ...], str, Any, list[T] | None], list[T]],
         path: tuple[str, ...] = ()) -> list[T]:
    """A section's data as every format orders it: a level's scalars (`fields`), then in
    data order its mappings (`branch`, `inner` their own walk) and tables (`inner` None)."""
    parts = fields(path, {k: v for k, v in data.items()
                          if not isinstance(v, dict) and not is_table(v)})
    for key, value in data.items():
        if isinstance(value, dict):
            parts += branch(path, key, value, walk(value, fields, branch, (*path, key)))
        elif is_table(value):
            parts += branch(path, key, value, None)
    return parts


def table_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Columns in first-seen order across all rows."""
    columns: dict[str, None] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, None)
    return list(columns)


def is_verbatim(key: str, value: Any) -> bool:
    """Command output kept as written: a multi-line string under a key ending `_output`."""
    return str(key).endswith("_output") and isinstance(value, str) and "\n" in value


FIELD_MAX = 4096  # one field on a terminal (docs/html.md, "Escaping")

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
    """`value` as inline code; with a backtick in it as HTML <code>, Markdown-escaped."""
    text = terminal(value)
    if "`" not in text:
        return f"`{text}`"
    return f"<code>{markdown(text)}</code>"


def shown(value: object) -> str:
    """`terminal(value)` cut at FIELD_MAX characters (the JSON report keeps it whole)."""
    text = terminal(value)
    if len(text) <= FIELD_MAX:
        return text
    return f"{text[:FIELD_MAX]}... ({len(text) - FIELD_MAX} more characters in the JSON report)"


def html(value: object) -> str:
    """`value` as HTML text or an attribute value."""
    return _html.escape(terminal(value))
