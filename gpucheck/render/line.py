"""`--format line`: the whole report in exactly one short line, for machines.

It reads as a SLURM drain reason should (`scontrol update ... reason="<line>"`), as a
node-problem-detector condition message and as a Nagios status line: the verdict, the
action, the worst problem and what it is about. The worst is the most severe status,
then the most disruptive action (`gpucheck.actions.ACTIONS` order), then the first in
the report. ASCII only, no control characters, at most MAX_CHARS.
"""

from __future__ import annotations

import re

from gpucheck.actions import ACTIONS
from gpucheck.report import Finding, Report, Status
from gpucheck.subject import Kind, Subject

MAX_CHARS = 200  # NPD's default max_output_length is 80: its config here raises it
PREFIX = "gpucheck"
_UNSAFE = re.compile(r"[^\x20-\x7e]+")  # control characters and non-ASCII
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """One line of printable ASCII: anything else becomes a space, runs of spaces one."""
    return _SPACES.sub(" ", _UNSAFE.sub(" ", text.replace("…", "..."))).strip()


def worst_finding(report: Report) -> Finding | None:
    """The problem to name first: the most severe status, then the most disruptive action."""
    problems = [f for f in report.findings if f.status in (Status.WARN, Status.FAIL)]
    if not problems:
        return None
    # The position from enumerate: problems.index(f) made this quadratic (minutes for a
    # report of many thousand findings).
    _, worst = max(enumerate(problems), key=lambda pair: (
        pair[1].status.severity, ACTIONS.index(pair[1].action or "none"), -pair[0]))
    return worst


def _fit(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _short_subject(subject: Subject) -> str:
    """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)" -> "GPU 3 (bus 00000000:9A:00.0)":
    the index and bus id find the GPU; the model and UUID are in the full report. From
    a GPU subject's fields; any other subject as its label."""
    if subject.kind is Kind.GPU and subject.gpu is not None:
        bus = f" (bus {subject.bus_id})" if subject.bus_id else ""
        return f"GPU {subject.gpu}{bus}"
    return subject.label


def _scope(report: Report) -> str:
    """The scope's head, before its first colon ("CPU ranks, no GPU"): one line is short."""
    return f" ({report.scope.split(':')[0]})" if report.scope else ""


def render_line(report: Report) -> str:
    worst = worst_finding(report)
    counts = report.summary()
    if worst is None:
        verdict = report.verdict().value
        skipped = f", {counts['SKIP']} skipped" if counts["SKIP"] else ""
        first_skip = next((f for f in report.findings if f.status is Status.SKIP), None)
        why = f": {first_skip.check}: {first_skip.message}" if first_skip and skipped else ""
        line = (f"{PREFIX} {report.command} {verdict}{_scope(report)}: {counts['OK']} checks OK"
                f"{skipped}{why}")
        return _fit(clean(line)) + "\n"
    others = counts["WARN"] + counts["FAIL"] - 1
    more = f" (+{others} more)" if others else ""
    about = f"{_short_subject(worst.subject)}: " if worst.subject else ""
    head = f"{PREFIX} {report.command} {worst.status.value} {worst.action}{_scope(report)}" \
        f"{more}: {about}"
    return _fit(clean(f"{head}{worst.check}: {worst.message}")) + "\n"
