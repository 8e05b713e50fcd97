"""JSON renderer: the documented, versioned schema (see README, "JSON schema")."""

from __future__ import annotations

import json

from gpucheck.render.headline import headline_rows
from gpucheck.report import Report


def render_json(report: Report) -> str:
    """`figures`: the headline table the other formats show under the verdict, derived
    from the sections (Report.from_dict ignores it; compare and fleet read metrics)."""
    raw = report.to_dict()
    at = list(raw).index("summary") + 1
    items = list(raw.items())
    shaped = dict([*items[:at], ("figures", headline_rows(report)), *items[at:]])
    return json.dumps(shaped, indent=2, sort_keys=False, default=str) + "\n"
