"""Formatting of plain values shared by the text and Markdown renderers."""

from __future__ import annotations

from typing import Any

from gpucheck.units import fmt_bytes

__all__ = ["fmt_bytes", "fmt_field", "fmt_value", "is_table", "table_columns"]


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


def table_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Columns in first-seen order across all rows."""
    columns: dict[str, None] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, None)
    return list(columns)


def is_verbatim(key: str, value: Any) -> bool:
    """Command output kept as written (env's `collect_env_output`): a multi-line string
    under a key ending in `_output`. Markdown and HTML show it as a code block; text
    says where to read it."""
    return str(key).endswith("_output") and isinstance(value, str) and "\n" in value
