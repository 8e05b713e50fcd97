"""What a chart takes from the report's verdicts: which bars are flagged, where the
threshold and baseline lines go. Read from the sections' data and findings, never
re-invented here, so a chart cannot paint red what the check called OK (the old
charts painted bars red under 0.9 x the median while stress on CPU warns under 0.5).

- stress `gemm` and `membw`: `peer_threshold` and `expected_threshold` in the
  section's data (the --peer-threshold and --expected-threshold the verdicts used),
  against each row's `vs_peers` (its value / its node's median) and `vs_expected`.
- bench `timing`: the ranks its WARN/FAIL findings name (the straggler check judges
  a rank's pace against the others', not its images/s against a line): a rank
  subject's `rank` field; never its words.
- `baseline` (a load command run with --baseline): its `limits` rows, metric key ->
  limit, matched to the bars by their metrics' keys.

The bars themselves are the sections' metrics (gpucheck.render.chart_find).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.render.values import is_table
from gpucheck.report import Report, Section, Status
from gpucheck.subject import Kind
from gpucheck.units import number


def baseline_limits(report: Report) -> dict[str, float]:
    """The baseline's limit per metric name, when the report was judged against one."""
    limits: dict[str, float] = {}
    for section in report.sections:
        if section.name.rsplit(".", 1)[-1] != "baseline":
            continue
        rows: Any = section.data.get("limits")
        for row in rows if is_table(rows) else []:
            limit = number(row.get("limit"))
            if limit is not None and isinstance(row.get("metric"), str):
                limits[row["metric"]] = limit
    return limits


def flagged_ranks(section: Section) -> set[str]:
    """`rank N` (the bar's label) for every rank a WARN or FAIL finding of `section` is
    about: a rank subject's `rank` field."""
    return {f"rank {f.subject.rank}" for f in section.findings
            if f.status in (Status.WARN, Status.FAIL) and f.subject is not None
            and f.subject.kind is Kind.RANK and f.subject.rank is not None}


class PeerRule:
    """stress's rule for one section: a rank is flagged below `peer` x its node's median
    or `expected` x its GPU model's typical figure (`gpucheck.stress.verdicts`)."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.peer = number(section.data.get("peer_threshold"))
        self.expected = number(section.data.get("expected_threshold"))

    def flagged(self, rows: list[dict[str, Any]]) -> set[str]:
        if self.peer is None:  # no threshold in the data: what the findings flagged
            return flagged_ranks(self.section)
        return {f"rank {r['rank']}" for r in rows if self._below(r)}

    def _below(self, row: dict[str, Any]) -> bool:
        vs_peers, vs_expected = number(row.get("vs_peers")), number(row.get("vs_expected"))
        peers = vs_peers is not None and self.peer is not None and vs_peers < self.peer
        return peers or (vs_expected is not None and self.expected is not None
                         and vs_expected < self.expected)

    def limits(self, bars: Mapping[str, float], rows: list[dict[str, Any]]
               ) -> dict[str, float]:
        """Bar label -> where the peer WARN starts for it: `peer` x its node's median
        (the bar's value over its row's `vs_peers`, the ratio the verdict used)."""
        found = {}
        for row in rows:
            label, vs_peers = f"rank {row.get('rank')}", number(row.get("vs_peers"))
            if self.peer is not None and label in bars and vs_peers:
                found[label] = self.peer * bars[label] / vs_peers
        return found

    def describe(self, rows: list[dict[str, Any]]) -> str:
        if self.peer is None:
            return "red: a rank this section's findings warned about"
        judged = any(number(r.get("vs_expected")) is not None for r in rows)
        expected = (f" or {self.expected:g} x its GPU model's typical figure"
                    if self.expected is not None and judged else "")
        return f"red: below {self.peer:g} x its node's median{expected}"

    def limit_label(self) -> str:
        return f"WARN below {self.peer:g} x node median" if self.peer is not None else ""
