"""`--baseline FILE` for the load commands (bench, comm, stress, all).

A baseline is saved by `gpucheck fleet --save-baseline FILE` from healthy nodes'
reports (docs/fleet.md): per metric, the expected value and a limit. Given to a
load command, it turns into floors: the report gets a `baseline` section with a
WARN for each figure beyond its limit. The file is read and checked before any
rank starts, so a bad file is a usage error (exit 2) and nothing runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpucheck.errors import UsageError
from gpucheck.report import Report, Section


def add_baseline_argument(group: Any) -> None:
    # dest differs from fleet's own --baseline, which fleet applies itself.
    group.add_argument("--baseline", dest="load_baseline", metavar="FILE", default=None,
                       help="WARN for each figure beyond its limit in this baseline (saved by "
                            "gpucheck fleet --save-baseline)")


def read_baseline_option(args: argparse.Namespace) -> Any:
    """The Baseline given with --baseline, or None; a bad file is a UsageError."""
    path = getattr(args, "load_baseline", None)
    if path is None:
        return None
    from gpucheck.analysis.baseline import BaselineError, load_baseline

    try:
        return load_baseline(path)
    except BaselineError as exc:
        raise UsageError(f"--baseline {exc}") from None


def baseline_section(report: Report, baseline: Any) -> Section:
    """This report's figures against the baseline's limits."""
    from gpucheck.analysis.baseline import baseline_findings
    from gpucheck.analysis.metrics import metrics_of

    metrics = metrics_of(report)
    shared = [name for name in metrics if name in baseline.metrics]
    data = {"tolerance": baseline.tolerance, "baseline_metrics": len(baseline.metrics),
            "report_metrics": len(metrics), "shared_metrics": len(shared),
            # Every shared figure against its limit: what the WARNs judged, and the
            # floor the HTML charts draw (gpucheck.render.chart_rules).
            "limits": [{"metric": name, "value": metrics[name].value,
                        "expected": baseline.metrics[name].expected,
                        "limit": baseline.metrics[name].limit,
                        "beyond": baseline.metrics[name].beyond(metrics[name].value)}
                       for name in shared]}
    return Section("baseline", "Against the baseline", data,
                   baseline_findings(metrics, baseline))
