"""Library warnings caught on every rank into the report's `log` section instead of
stderr (docs/hang.md, "The rank frame"); each kept once, with its ranks."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpucheck.errors import UsageError
from gpucheck.output import write_atomic

WARNINGS_FILE = "warnings-{rank}.json"
WARNINGS_GLOB = "warnings-*.json"
MAX_KEPT = 20  # distinct warnings; a flood is cut, not kept whole
MAX_TEXT = 300

Rows = list[dict[str, Any]]


@contextmanager
def caught(rank: int, kept: Rows, folder: Path | None) -> Iterator[None]:
    """Record every warning raised in the block (once per place, as Python's default
    filter shows it), keep it for the report, publish it for the launcher in the run
    directory `folder` (when the job has one)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            rows = [_row(w, rank) for w in seen]
            remember(kept, rows)
            _publish(folder, rank, rows)


def _row(warning: warnings.WarningMessage, rank: int) -> dict[str, Any]:
    text = str(warning.message).strip().splitlines()
    return {"category": warning.category.__name__,
            "message": (text[0] if text else "")[:MAX_TEXT],
            "where": f"{Path(warning.filename).name}:{warning.lineno}", "ranks": [rank]}


def _publish(folder: Path | None, rank: int, rows: list[dict[str, Any]]) -> None:
    if folder is None or not rows:
        return
    # The log is a courtesy: a full disk must not fail the rank.
    with contextlib.suppress(UsageError):  # WriteError, or an unsafe folder
        write_atomic(str(folder / WARNINGS_FILE.format(rank=rank)), json.dumps(rows),
                     "the run directory", sync=False)


def gather(folder: Path, kept: Rows) -> None:
    """The warnings every rank left in the run directory `folder`, kept for the report."""
    for path in sorted(folder.glob(WARNINGS_GLOB)):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rows, list):
            remember(kept, [r for r in rows if isinstance(r, dict)])


def remember(kept: Rows, rows: Rows) -> None:
    """Merge `rows` into the `kept` ones: one row per (category, message, where)."""
    for row in rows:
        key = (row.get("category"), row.get("message"), row.get("where"))
        same = next((k for k in kept if (k["category"], k["message"], k["where"]) == key),
                    None)
        if same is not None:
            same["ranks"] = sorted({*same["ranks"], *row.get("ranks", [])})
        elif len(kept) < MAX_KEPT:
            kept.append({"category": str(key[0]), "message": str(key[1]),
                         "where": str(key[2]), "ranks": list(row.get("ranks", []))})


def log_rows(kept: Rows) -> Rows:
    """Everything caught since the last call, then forgotten (`all` runs several
    commands in one process: its report gets them all once)."""
    rows = list(kept)
    kept.clear()
    return rows
