"""`gpucheck health`: state in, every check (NVML, kernel log, IB) on its own daemon
thread under one deadline, report, state out (docs/health.md, "The budget").
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

from gpucheck.devices import ExpectedGpus, expected_gpus, nvidia_pci_devices
from gpucheck.errors import UsageError
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
from gpucheck.probes.gpu_judge import count_finding, driver_finding, gpu_findings, hang_finding
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord, read_driver, read_gpu
from gpucheck.probes.gpus import second_look
from gpucheck.probes.kernel_log import Runner, read_kernel_log, run_command
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S, Nvml
from gpucheck.probes.xid_section import TITLE as XID_TITLE
from gpucheck.report import Finding, Report, Section, Status, fail, skip, warn
from gpucheck.subject import gpu


@dataclass(frozen=True)
class Outcome:
    """A check's value, the error that ended it, or neither when it did not finish."""

    value: Any = None
    error: str | None = None
    finished: bool = True


class Deadline:
    """An instant on the monotonic clock, and how long until it."""

    def __init__(self, budget_s: float, start: float | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self.at = self.start + budget_s

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def spent(self) -> float:
        return time.monotonic() - self.start


def run_until(checks: Mapping[str, Callable[[], Any]], deadline: Deadline) -> dict[str, Outcome]:
    """Run every check concurrently until the deadline or all are done (one still
    running keeps its daemon thread: what it shares is read as a snapshot)."""
    results: dict[str, Outcome] = {}
    lock = threading.Lock()

    def target(name: str, check: Callable[[], Any]) -> None:
        try:
            outcome = Outcome(check())
        except Exception as exc:  # a check must never take the command down
            outcome = Outcome(None, f"{type(exc).__name__}: {exc}")
        with lock:
            results[name] = outcome

    threads = [threading.Thread(target=target, args=item, daemon=True,
                                name=f"gpucheck-health-{item[0]}") for item in checks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline.left())
    with lock:
        return {name: results.get(name, Outcome(finished=False)) for name in checks}


# --- the GPUs: read as `env` reads them, less gpu.busy (a GPU at work is healthy) ---

@dataclass
class GpuProgress:
    """What the NVML read has got so far (written by its thread, read at the deadline)."""

    pci_gpus: int | None = None
    expected: ExpectedGpus | None = None
    driver: DriverInfo | None = None
    records: list[GpuRecord] = field(default_factory=list)
    reading: int | None = None  # the GPU index being read now
    done: bool = False


def read_gpus(progress: GpuProgress, nvml: Nvml, sysfs: Path,
              expected: ExpectedGpus) -> GpuProgress:
    """The driver, then every GPU in turn (`nvidia-smi -q`), recording progress."""
    progress.pci_gpus = nvidia_pci_devices(str(sysfs / "bus/pci/devices"))
    progress.expected = expected
    progress.driver = read_driver(nvml)
    for index in range(progress.driver.gpu_count or 0):
        progress.reading = index
        progress.records.append(read_gpu(nvml, index, sysfs))
    progress.reading = None
    # A slowdown in one sample is watched a moment: only a held one is judged.
    progress.records[:] = second_look(nvml, progress.records)
    progress.done = True
    nvml.shutdown()
    return progress


def gpus_section(progress: GpuProgress, budget_s: float, hang: Finding | None = None,
                 most_seen: int | None = None) -> Section:
    """Driver, count and per-GPU findings from what was read; SKIPs for the rest."""
    driver, expected = progress.driver, progress.expected
    findings: list[Finding] = []
    if driver is not None:
        findings.append(driver_finding(driver, progress.pci_gpus or 0))
    if hang is not None:
        findings.append(hang)
    if driver is not None and expected is not None and (driver.present or expected.count):
        findings.append(count_finding(driver.gpu_count if driver.present else None,
                                      expected, most_seen))
    for record in list(progress.records):
        findings += [f for f in gpu_findings(record) if f.check != "gpu.busy"]
    why = f"did not finish within the {budget_s:g} s budget"
    if not progress.done and driver is None:
        findings.append(skip("driver.nvml", f"NVML {why} (starting NVML or reading the "
                             "driver): nothing judged; run nvidia-smi to see whether it answers"))
    elif not progress.done and driver is not None:
        done = {r.index for r in progress.records}
        findings += [skip("gpu.query", f"NVML {why} while reading this GPU"
                          if i == progress.reading else f"not read: NVML {why}", gpu(i))
                     for i in range(driver.gpu_count or 0) if i not in done]
    data = {"driver_version": driver.driver_version if driver else None,
            "gpu_count": driver.gpu_count if driver else None,
            "nvidia_pci_devices": progress.pci_gpus,
            "gpus": [r.row() for r in list(progress.records)]}
    return Section("gpus", "NVIDIA driver and GPUs", data, findings)


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


def _health_section(report: Report, options: HealthOptions, state: HealthState,
                    unfinished: list[str], spent_s: float) -> Section:
    """Budget, what did not finish, until when it holds, what cleared; an unread state
    FAILs (it may have held a fault that never clears by itself)."""
    try:
        created = dt.datetime.fromisoformat(report.created_at)
    except ValueError:
        created = dt.datetime.now(dt.timezone.utc)
    last = state.last
    cleared = sorted(set(last.get("problems") or []) - set(problem_keys(report)))
    data = {"budget_s": options.budget_s, "checks_s": round(spent_s, 3),
            "unfinished": unfinished, "valid_until": (created + dt.timedelta(
                seconds=options.valid_for_s)).isoformat(timespec="seconds"),
            "state_dir": None if options.state_dir is None else str(options.state_dir),
            "previous": {"verdict": last.get("verdict"), "at": last.get("at")} if last else None,
            "cleared_since_previous": [k.replace("|", " on ", 1).rstrip() for k in cleared]}
    if state.cleared:
        data["faults_cleared"] = state.cleared
    findings = []
    if state.unknown is not None:  # the how first: a drain reason is short
        assert options.state_dir is not None  # only a state dir has a state to read
        findings.append(fail(
            "health.state", "not known to be healthy until an administrator runs "
            f"`gpucheck health --set-healthy --state-dir {options.state_dir}` (a state "
            f"could not be read: {state.unknown})",
            f"look at {options.state_dir / SET_ASIDE} (the faults it held, if "
            "any, are not reported now), deal with them, then run --set-healthy as the "
            "message says"))
    return Section("health", "Health check run", data, findings)


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


def collect_health_report(options: HealthOptions, start: float | None = None) -> Report:
    """Every check under one budget; the state read first and written last."""
    reserve = min(RESERVE_S, options.budget_s * RESERVE_SHARE)
    deadline = Deadline(options.budget_s - reserve, start)
    state = load_state(options.state_dir, options.consumer)
    boot_id = read_boot_id(options.proc)
    if options.set_healthy:
        state = set_healthy(options, state, boot_id, deadline)
    progress = GpuProgress()
    outcomes = run_until(_checks(options, deadline, progress), deadline)
    report = Report(command="health")
    most = state.gpus.get("most_seen")
    seen_before = most if isinstance(most, int) and not isinstance(most, bool) else None
    gpus = outcomes["gpus"]
    report.add(_probe_failed("gpus", "NVIDIA driver and GPUs", gpus.error) if gpus.error
               else gpus_section(progress, options.budget_s, hang_finding(gpus.value)
                                 if gpus.finished else None, seen_before))
    xids = _xid_part(outcomes["kernel_log"], progress, state, boot_id, options.budget_s)
    added: list[dict[str, Any]] = []
    cleared: set[str] = set()
    if options.state_dir is not None:  # the remembered faults still reported
        still, gone = carry(state.faults, boot_id)
        added = new_faults(xids.faults, boot_id, report.created_at)
        xids.section.findings += still_findings(still, {f["key"] for f in added})
        xids.section.data["still_reported"] = [f["key"] for f in still]
        state.cleared += [f"{f['key']} (cleared by a reboot)" for f in gone]
        cleared = {f["key"] for f in gone}
    report.add(xids.section)
    ib, ports = _ib_part(outcomes["ib"], state, state.same_boot(boot_id), options,
                         report.created_at)
    report.add(ib)
    unfinished = [name for name, outcome in outcomes.items() if not outcome.finished]
    if unfinished:  # the headline (and the one line) say what the verdict does not cover
        # no colon: the one line shows a scope up to its first (gpucheck.render.headline)
        report.scope = (f"{', '.join(unfinished)} not finished within the "
                        f"{options.budget_s:g} s budget (an unknown, not an all-clear)")
    health = _health_section(report, options, state, unfinished, deadline.spent())
    report.add(health)
    if options.state_dir is None:
        return report
    driver = progress.driver
    new = HealthState(boot_id=boot_id, kernel_log=xids.cursor, ib_ports=ports,
                      ib_history={k: {"seen_active": True} for k, v in ports.items()
                                  if v.get("seen_active")},
                      gpus={"most_seen": max(seen_before or 0, driver.gpu_count or 0)
                            if progress.done and driver is not None and driver.present
                            else seen_before},
                      last={"verdict": report.verdict().value, "at": report.created_at,
                            "problems": problem_keys(report)},
                      faults=state.faults, baseline=state.baseline, unknown=state.unknown)
    problem = write_state(options.state_dir, merged(options.state_dir, options.consumer, new,
                                                    added, cleared))
    if problem is not None:
        health.findings.append(warn(
            "health.state", f"the state could not be saved ({problem}): the next run "
            "raises again what this one raised", "check the state dir's disk and rights"))
    return report
