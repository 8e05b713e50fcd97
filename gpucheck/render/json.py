"""JSON renderer: the documented, versioned schema (see README, "JSON schema")."""

from __future__ import annotations

import json

from gpucheck.report import Report


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str) + "\n"
