"""`--format prometheus`: the report in Prometheus' text exposition format (0.0.4).

For node_exporter's textfile collector (write it atomically into the collector's
directory: `gpucheck health -o DIR/gpucheck.prom`) or any scraper. Metrics:
- `gpucheck_check_status{command, check, subject, gpu, hca, port, status, action}`: one
  gauge per check and per GPU or port, its value the status's severity (0 OK, 1 SKIP,
  2 WARN, 3 FAIL); several findings of one check on one subject are folded into the
  worst; `command` keeps two commands' files in one textfile directory apart (the
  collector refuses one series written twice);
- `gpucheck_verdict{command}`: the node's verdict, same scale;
- `gpucheck_findings{command, status}`: how many findings of each status;
- `gpucheck_report_timestamp_seconds{command}`: when the report was made;
- `gpucheck_valid_until_timestamp_seconds{command}`: until when it holds, for a report
  that says so (`gpucheck health`'s `valid_until`): alert when `time()` passes it.
No sample carries a timestamp: the textfile collector refuses them.
Source: https://prometheus.io/docs/instrumenting/exposition_formats/ (label values
escape backslash, double quote and newline; HELP text backslash and newline).
"""

from __future__ import annotations

import datetime as dt

from gpucheck.report import Finding, Report
from gpucheck.subject import Subject

LABELS = ("command", "check", "subject", "gpu", "hca", "port", "status", "action")


def escape(value: str) -> str:
    """A label value as the format wants it: UTF-8 text (a name read from sysfs that is
    not UTF-8 arrives as lone surrogates: they become \\xNN, shown as the bytes, with
    the backslash escaped), then backslash, newline and double quote escaped."""
    if not value.isascii():
        try:  # a file name's undecodable bytes (surrogateescape) back to bytes, shown
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # any other lone surrogate
            value = value.encode("utf-8", "backslashreplace").decode("ascii")
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def _header(name: str, text: str) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge"]


def _subject_labels(subject: Subject | None) -> dict[str, str]:
    """The GPU index or HCA and port a subject names, from its fields (a port's field
    is "mlx5_0/1"); never read from its words."""
    if subject is None:
        return {"subject": "", "gpu": "", "hca": "", "port": ""}
    hca, _, number = (subject.port or "").rpartition("/")
    return {"subject": subject.label,
            "gpu": str(subject.gpu) if subject.gpu is not None else "",
            "hca": hca, "port": number if subject.port else ""}


def folded(report: Report) -> list[Finding]:
    """One finding per (check, subject): the worst, the first of equals."""
    worst: dict[tuple[str, str], Finding] = {}
    for finding in report.findings:
        key = (finding.check, finding.subject or "")
        if key not in worst or finding.status.severity > worst[key].status.severity:
            worst[key] = finding
    return list(worst.values())


def _epoch(stamp: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return None


def _valid_until(report: Report) -> float | None:
    stamps = [s.data.get("valid_until") for s in report.sections]
    return next((e for e in map(_epoch, (s for s in stamps if isinstance(s, str)))
                 if e is not None), None)


def _times(report: Report, command: dict[str, str]) -> list[str]:
    lines: list[str] = []
    created, until = _epoch(report.created_at), _valid_until(report)
    if created is not None:
        lines += _header("gpucheck_report_timestamp_seconds", "When the report was made "
                         "(Unix time).")
        lines.append(f"gpucheck_report_timestamp_seconds{_labels(command)} {created:.0f}")
    if until is not None:
        lines += _header("gpucheck_valid_until_timestamp_seconds", "Until when the report "
                         "holds (Unix time): a later time() means the check stopped running.")
        lines.append(f"gpucheck_valid_until_timestamp_seconds{_labels(command)} {until:.0f}")
    return lines


def render_prometheus(report: Report) -> str:
    command = {"command": report.command}
    lines = _header("gpucheck_check_status", "Status of one check on one subject: 0 OK, "
                    "1 SKIP, 2 WARN, 3 FAIL.")
    for f in folded(report):
        labels = {**command, "check": f.check, **_subject_labels(f.subject),
                  "status": f.status.value, "action": f.action or ""}
        lines.append(f"gpucheck_check_status{_labels(labels)} {f.status.severity}")
    lines += _header("gpucheck_verdict", "The report's verdict: 0 OK, 1 SKIP, 2 WARN, 3 FAIL.")
    lines.append(f"gpucheck_verdict{_labels(command)} {report.verdict().severity}")
    lines += _header("gpucheck_findings", "Findings of each status in the report.")
    for status, count in report.summary().items():
        lines.append(f"gpucheck_findings{_labels({**command, 'status': status})} {count}")
    lines += _times(report, command)
    return "\n".join(lines) + "\n"



