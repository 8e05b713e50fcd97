"""Regenerate the golden renderings: `python tests/golden/regen.py` from the repository
root (then read the diff in review: every changed line is a change users will see).

Each canned report of tests/data/reports listed in CASES is rendered to text (the
renderer's fixed width, no colour), Markdown and plain Markdown, and stored here as
`<report>.txt`, `<report>.md` and `<report>.plain.md`; tests/test_golden.py compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPORTS = ROOT / "tests" / "data" / "reports"
# A healthy run of each load command, a failed verdict, a failed run and env.
CASES = ("bench", "comm", "stress", "stress_fail", "comm_failed", "env_gpu")
FORMATS = {"txt": "text", "md": "markdown", "plain.md": "markdown-plain"}


def rendered() -> dict[str, str]:
    """File name -> its expected content."""
    from gpucheck.render import render
    from gpucheck.report import Report

    out = {}
    for case in CASES:
        report = Report.from_dict(json.loads((REPORTS / f"{case}.json").read_text()))
        for suffix, fmt in FORMATS.items():
            out[f"{case}.{suffix}"] = render(report, fmt)
    return out


def main() -> int:
    for name, text in rendered().items():
        (HERE / name).write_text(text, encoding="utf-8")
        print(f"wrote tests/golden/{name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
