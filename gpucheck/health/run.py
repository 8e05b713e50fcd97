"""`gpucheck health`: state in, every check on its own daemon thread under one
deadline, report, state out. What did not finish by the deadline is a SKIP and its
state is kept as it was (docs/health.md, "The budget").
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.devices import expected_gpus
from gpucheck.errors import UsageError
from gpucheck.health.gpus import GpuProgress, gpus_section, most_seen, read_gpus
from gpucheck.health.ib import TITLE as IB_TITLE
from gpucheck.health.ib import IbOptions, judge_ports, read_ports
from gpucheck.health.state import (
    DEFAULT_CONSUMER,
    SET_ASIDE,
    HealthState,
    clear_set_aside,
    load_state,
    merged,
    read_boot_id,
    write_state,
)
from gpucheck.health.xids import XidPart, carry, cursor_of, new_faults, still_findings, xid_section
from gpucheck.probes.gpu_judge import hang_finding
from gpucheck.probes.kernel_log import Runner, read_kernel_log, run_command
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S, Nvml
from gpucheck.probes.xid_section import TITLE as XID_TITLE
from gpucheck.report import Finding, Report, Section, Status, fail, skip, warn

# --- the budget: one deadline, each check on a daemon thread ----------------

@dataclass(frozen=True)
class Outcome:
    """A check's value, the error that ended it, or neither when it did not finish."""

    value: Any = None
    error: str | None = None
    finished: bool = True
    seconds: float = 0.0


class Deadline:
    """An instant on the monotonic clock, and how long until it."""

    def __init__(self, budget_s: float, start: float | None = None) -> None:
        self.budget_s = budget_s
        self.start = time.monotonic() if start is None else start
        self.at = self.start + budget_s

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def spent(self) -> float:
        return time.monotonic() - self.start


def run_until(checks: Mapping[str, Callable[[], Any]], deadline: Deadline) -> dict[str, Outcome]:
    """Run every check concurrently; return at the deadline or when all are done (one
    still running keeps its daemon thread: what it shares is read as a snapshot)."""
    results: dict[str, Outcome] = {}
    lock = threading.Lock()

    def target(name: str, check: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            outcome = Outcome(check(), None, True, time.monotonic() - began)
        except Exception as exc:  # a check must never take the command down
            outcome = Outcome(None, f"{type(exc).__name__}: {exc}", True,
                              time.monotonic() - began)
        with lock:
            results[name] = outcome

    threads = [threading.Thread(target=target, args=item, daemon=True,
                                name=f"gpucheck-health-{item[0]}") for item in checks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline.left())
    with lock:
        done = dict(results)
    return {name: done.get(name, Outcome(finished=False, seconds=deadline.spent()))
            for name in checks}


def process_age_s(proc: str = "/proc") -> float | None:
    """Seconds since this process started (`ps -o etimes= -p $$`): /proc/self/stat's
    starttime and /proc/uptime; None where unreadable."""
    try:
        with open(f"{proc}/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"{proc}/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        age = up_s - int(fields[19]) / ticks  # field 22 counted from 1, after "pid (comm)"
    except (OSError, ValueError, IndexError):
        return None
    return age if age >= 0 else None


def start_of_run(budget_s: float, now: float | None = None) -> float:
    """When the budget starts: at the process's start when recent (what a scheduler
    times), else now (an older process calling in, e.g. a test runner)."""
    now = time.monotonic() if now is None else now
    age = process_age_s()
    return now - age if age is not None and age < budget_s / 2 else now


DEFAULT_BUDGET_S = 5.0
DEFAULT_VALID_FOR_S = 600.0
RESERVE_S = 0.25  # at most this much of the budget is kept for judging and writing
RESERVE_SHARE = 0.2  # and at most this share of a short budget


@dataclass(frozen=True)
class HealthOptions:
    """`gpucheck health`'s options; the roots are parameters for fake trees."""

    budget_s: float = DEFAULT_BUDGET_S
    nvml_timeout_s: float = DEFAULT_TIMEOUT_S
    expect_gpus: int | None = None
    ib: IbOptions = field(default_factory=IbOptions)
    state_dir: Path | None = None
    kernel_log: str | None = None
    valid_for_s: float = DEFAULT_VALID_FOR_S
    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    runner: Runner = run_command
    consumer: str = DEFAULT_CONSUMER
    set_healthy: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)  # SLURM's GRES, the container's


def _capped(runner: Runner, deadline: Deadline) -> Runner:
    """The log commands' timeouts cut to the budget left (never a dmesg left behind)."""
    return lambda argv, timeout_s: runner(argv, max(0.05, min(timeout_s, deadline.left())))


def _checks(options: HealthOptions, deadline: Deadline,
            progress: GpuProgress) -> dict[str, Callable[[], Any]]:
    nvml = Nvml(options.nvml_timeout_s, attach_timeout_s=options.budget_s)
    runner = _capped(options.runner, deadline)
    expected = expected_gpus(options.environ, options.sysfs, options.expect_gpus)
    return {"gpus": lambda: (read_gpus(progress, nvml, options.sysfs, expected), nvml)[1],
            "kernel_log": lambda: read_kernel_log(options.kernel_log, runner),
            "ib": lambda: read_ports(options.sysfs)}


def _probe_failed(name: str, title: str, error: str) -> Section:
    return Section(name, title, {"probe_error": error}, [fail(
        f"{name}.probe", f"the {name} check failed: {error}",
        "run it again with --format json and report a gpucheck bug with the output")])


def _late(check: str, what: str, budget_s: float) -> Finding:
    return skip(check, f"{what} did not finish within the {budget_s:g} s budget: not judged "
                "this time (raise --budget if it is always slow)")


def _gpu_part(outcome: Outcome, progress: GpuProgress, options: HealthOptions,
              before: int | None) -> Section:
    if outcome.error is not None:
        return _probe_failed("gpus", "NVIDIA driver and GPUs", outcome.error)
    hang = hang_finding(outcome.value) if outcome.finished else None
    return gpus_section(progress, options.budget_s, hang, before)


def _start_cursor(state: HealthState, boot_id: str | None) -> tuple[dict[str, Any], bool]:
    """This consumer's cursor; a new one starts at the `--set-healthy` baseline."""
    if state.kernel_log.get("tail") or state.kernel_log.get("count"):
        return state.kernel_log, state.same_boot(boot_id)
    base = state.baseline
    if base and boot_id is not None and base.get("boot_id") == boot_id:
        return base.get("kernel_log") or {}, True
    return state.kernel_log, False


def _xid_part(outcome: Outcome, progress: GpuProgress, state: HealthState,
              boot_id: str | None, budget_s: float) -> XidPart:
    if not outcome.finished:
        return XidPart(Section("kernel_log", XID_TITLE, {}, [_late("kernel_log.read",
                       "reading the kernel log", budget_s)]), state.kernel_log)
    cursor, same_boot = _start_cursor(state, boot_id)
    return xid_section(outcome.value, cursor, same_boot, list(progress.records),
                       outcome.error)


def _ib_part(outcome: Outcome, state: HealthState, same_boot: bool, options: HealthOptions,
             now: str) -> tuple[Section, dict[str, Any]]:
    if not outcome.finished:
        return (Section("ib", IB_TITLE, {}, [_late("ib.ports", "reading /sys/class/infiniband",
                                                   options.budget_s)]), state.ib_ports)
    if outcome.error is not None:
        return _probe_failed("ib", IB_TITLE, outcome.error), state.ib_ports
    judged = judge_ports(outcome.value, port_history(state, same_boot), options.ib, now)
    return judged.section, judged.remembered


def port_history(state: HealthState, same_boot: bool) -> dict[str, dict[str, Any]]:
    """Each port: this consumer's counters (this boot's), and whether the node ever saw
    it active."""
    own = state.ib_ports if same_boot else {}
    return {key: {**own.get(key, {}), "seen_active": bool(
                state.ib_history.get(key, {}).get("seen_active")
                or state.ib_ports.get(key, {}).get("seen_active"))}
            for key in {*state.ib_ports, *state.ib_history}}


def problem_keys(report: Report) -> list[str]:
    """"check|subject" of every WARN and FAIL: what the next run says has cleared."""
    return sorted({f"{f.check}|{f.subject or ''}" for f in report.findings
                   if f.status in (Status.WARN, Status.FAIL)})


def _utc(stamp: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(stamp)
    except ValueError:
        return dt.datetime.now(dt.timezone.utc)


def _health_section(report: Report, options: HealthOptions, state: HealthState,
                    unfinished: list[str], spent_s: float) -> Section:
    """Budget, what did not finish, until when it holds, what cleared."""
    valid_until = _utc(report.created_at) + dt.timedelta(seconds=options.valid_for_s)
    last = state.last
    cleared = sorted(set(last.get("problems") or []) - set(problem_keys(report)))
    data = {"budget_s": options.budget_s, "checks_s": round(spent_s, 3),
            "unfinished": unfinished,
            "valid_until": valid_until.isoformat(timespec="seconds"),
            "state_dir": None if options.state_dir is None else str(options.state_dir),
            "previous": {"verdict": last.get("verdict"), "at": last.get("at")} if last else None,
            "cleared_since_previous": [k.replace("|", " on ", 1).rstrip() for k in cleared]}
    if state.cleared:
        data["faults_cleared"] = state.cleared
    findings = [] if state.unknown is None else [_unknown_finding(options, state)]
    return Section("health", "Health check run", data, findings)


def _unknown_finding(options: HealthOptions, state: HealthState) -> Finding:
    """An unread state may have held a fault that never clears by itself: unknown until
    a person has looked (the how first: a drain reason is short)."""
    assert options.state_dir is not None  # only a state dir has a state to read
    return fail("health.state", "not known to be healthy until an administrator runs "
                f"`gpucheck health --set-healthy --state-dir {options.state_dir}` (a state "
                f"could not be read: {state.unknown})",
                f"look at {options.state_dir / SET_ASIDE} (the faults it held, if any, are "
                "not reported now), deal with them, then run --set-healthy as the message "
                "says")


def set_healthy(options: HealthOptions, state: HealthState, boot_id: str | None,
                deadline: Deadline) -> HealthState:
    """`--set-healthy`: forget every fault, move every consumer's cursor (and the
    baseline) to the log's end; the state to run on."""
    assert options.state_dir is not None  # the command refuses --set-healthy without one
    log = read_kernel_log(options.kernel_log, _capped(options.runner, deadline))
    now = state
    now.cleared = [f"{f['key']} (cleared by --set-healthy)" for f in state.faults]
    problem = clear_set_aside(options.state_dir)
    if problem is not None:
        raise UsageError(f"--set-healthy: {problem}")
    if state.unknown is not None:
        now.cleared.append(f"health.state ({state.unknown}: cleared by --set-healthy)")
        now.unknown = None
    if log.source is not None:
        cursor = cursor_of(log)
        now.kernel_log, now.boot_id = cursor, boot_id
        now.baseline = {"boot_id": boot_id, "kernel_log": cursor}
    data = merged(options.state_dir, options.consumer, now, [], {f["key"] for f in state.faults})
    data["faults"], data["unread"] = [], {}
    if log.source is not None:
        data["baseline"] = now.baseline
        for part in data["consumers"].values():
            part.update(boot_id=boot_id, kernel_log=cursor)
    problem = write_state(options.state_dir, data)
    if problem is not None:
        raise UsageError(f"--set-healthy: {problem}")
    now.faults = []
    return now


def _remember(options: HealthOptions, report: Report, new: HealthState,
              added: list[dict[str, Any]], cleared: set[str]) -> None:
    assert options.state_dir is not None
    data = merged(options.state_dir, options.consumer, new, added, cleared)
    problem = write_state(options.state_dir, data)
    health = report.section("health")
    assert health is not None  # the report this run built has it
    if problem is not None:
        health.findings.append(warn(
            "health.state", f"the state could not be saved ({problem}): the next run "
            "raises again what this one raised", "check the state dir's disk and rights"))


def _faults(report: Report, part: XidPart, state: HealthState,
            boot_id: str | None) -> tuple[list[dict[str, Any]], set[str]]:
    """Add the remembered faults still reported; return the new ones and those cleared."""
    xids = part.section
    carried = carry(state.faults, boot_id)
    added = new_faults(part.faults, boot_id, report.created_at)
    xids.findings += still_findings(carried.still, {f["key"] for f in added})
    xids.data["still_reported"] = [f["key"] for f in carried.still]
    state.cleared += [f"{f['key']} (cleared by a reboot)" for f in carried.cleared]
    return added, {f["key"] for f in carried.cleared}


def collect_health_report(options: HealthOptions, start: float | None = None) -> Report:
    """Every check under one budget; the state read first and written last."""
    reserve = min(RESERVE_S, options.budget_s * RESERVE_SHARE)
    deadline = Deadline(options.budget_s - reserve, start)
    state = load_state(options.state_dir, options.consumer)
    boot_id = read_boot_id(options.proc)
    if options.set_healthy:
        state = set_healthy(options, state, boot_id, deadline)
    same_boot = state.same_boot(boot_id)
    progress = GpuProgress()
    outcomes = run_until(_checks(options, deadline, progress), deadline)
    report = Report(command="health")
    most = state.gpus.get("most_seen")
    seen_before = most if isinstance(most, int) and not isinstance(most, bool) else None
    report.add(_gpu_part(outcomes["gpus"], progress, options, seen_before))
    xids = _xid_part(outcomes["kernel_log"], progress, state, boot_id, options.budget_s)
    added, cleared = (_faults(report, xids, state, boot_id) if options.state_dir is not None
                      else ([], set()))
    report.add(xids.section)
    ib, ports = _ib_part(outcomes["ib"], state, same_boot, options, report.created_at)
    report.add(ib)
    unfinished = [name for name, outcome in outcomes.items() if not outcome.finished]
    if unfinished:  # the headline (and the one line) say what the verdict does not cover
        # no colon: the one line shows a scope up to its first (gpucheck.render.headline)
        report.scope = (f"{', '.join(unfinished)} not finished within the "
                        f"{options.budget_s:g} s budget (an unknown, not an all-clear)")
    report.add(_health_section(report, options, state, unfinished, deadline.spent()))
    if options.state_dir is not None:
        new = HealthState(boot_id=boot_id, kernel_log=xids.cursor, ib_ports=ports,
                          ib_history={k: {"seen_active": True} for k, v in ports.items()
                                      if v.get("seen_active")},
                          gpus={"most_seen": most_seen(progress, seen_before)},
                          last={"verdict": report.verdict().value, "at": report.created_at,
                                "problems": problem_keys(report)},
                          faults=state.faults, baseline=state.baseline,
                          unknown=state.unknown)
        _remember(options, report, new, added, cleared)
    return report
