"""Regenerate the golden renderings: `python tests/golden/regen.py` from the repository
root (then read the diff in review: every changed line is a change users will see).

Each canned report of tests/data/reports listed in CASES is rendered to text (the
renderer's fixed width, no colour), Markdown and plain Markdown, and stored here as
`<report>.txt`, `<report>.md` and `<report>.plain.md`; tests/test_golden.py compares.
COMPARES are `gpucheck compare` of two saved reports, rendered the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = ROOT / "tests" / "data"
REPORTS = DATA / "reports"
# A healthy run of each load command, a failed verdict, a failed run and env.
CASES = ("bench", "comm", "stress", "stress_fail", "comm_failed", "env_gpu")
FORMATS = {"txt": "text", "md": "markdown", "plain.md": "markdown-plain"}
# Two healthy comm runs back to back (issue 36 items 7 and 9: sizes in numeric order,
# CPU ranks' figures judged against what two runs differ by); paths under tests/data.
COMPARES = {"compare_comm": ("noise_pairs/comm_healthy_a", "noise_pairs/comm_healthy_b")}


def rendered() -> dict[str, str]:
    """File name -> its expected content."""
    from gpucheck.render import render
    from gpucheck.report import Report

    out = {}
    for case in CASES:
        report = Report.from_dict(json.loads((REPORTS / f"{case}.json").read_text()))
        for suffix, fmt in FORMATS.items():
            out[f"{case}.{suffix}"] = render(report, fmt)
    for case, (a, b) in COMPARES.items():
        compared = _compared(a, b)
        for suffix, fmt in FORMATS.items():
            out[f"{case}.{suffix}"] = render(compared, fmt)
    return out


def _compared(a: str, b: str):  # type: ignore[no-untyped-def]
    """`gpucheck compare` of two reports under tests/data, its paths made relative."""
    import tempfile

    from gpucheck.cli import main
    from gpucheck.report import Report

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compare.json"
        main(["compare", *(str(DATA / f"{n}.json") for n in (a, b)), "-q", "-o", str(out)])
        return Report.from_dict(json.loads(out.read_text().replace(f"{DATA}/", "")))


def main() -> int:
    for name, text in rendered().items():
        (HERE / name).write_text(text, encoding="utf-8")
        print(f"wrote tests/golden/{name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
