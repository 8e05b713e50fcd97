"""`gpucheck health`: the node check a scheduler or a monitor runs every few minutes.

Never imports torch, nor does anything it imports: it runs before a job's environment
exists. The checks live in `gpucheck.health`; docs/health.md has the recipes and rules.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpucheck.commands.options import Options, count, opt, real
from gpucheck.context import RunContext
from gpucheck.devices import sysfs_root
from gpucheck.errors import UsageError
from gpucheck.health.ib import IbOptions
from gpucheck.health.run import (
    DEFAULT_BUDGET_S,
    DEFAULT_VALID_FOR_S,
    HealthOptions,
    collect_health_report,
    start_of_run,
)
from gpucheck.health.state import CONSUMER, DEFAULT_CONSUMER, checked_state_dir
from gpucheck.probes.kernel_log import checked_kernel_log_path
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S
from gpucheck.report import Report, Section, Status

HELP = ("fast node health for schedulers and monitors (NVML, Xid since the last check, "
        "InfiniBand ports) under a time budget; never imports torch")
# Exit codes per convention (docs/health.md, "Exit codes"): slurm knows zero and not,
# node-problem-detector reads 2 as unknown, Nagios 0/1/2/3.
CONVENTIONS = ("slurm", "npd", "nagios")
DEFAULT_CONVENTION = "slurm"
# SLURM kills a HealthCheckProgram after 60 s: an hour is far past any use, and beyond
# these threading's timeouts overflow (--budget 1e10) and datetime does (--valid-for 1e12).
MAX_BUDGET_S = 3600.0
MAX_VALID_FOR_S = 366 * 86400.0


@dataclass(frozen=True)
class HealthArgs(Options):
    budget: float = opt("--budget", default=DEFAULT_BUDGET_S,
                        type=real(above=0, most=MAX_BUDGET_S), metavar="SECONDS",
                        help="never take longer than this: what has not finished is a SKIP "
                        f"(default: {DEFAULT_BUDGET_S:g})")
    convention: str = opt("--convention", default=DEFAULT_CONVENTION, choices=CONVENTIONS,
                          help="exit codes for: slurm (1 on FAIL), npd (node-problem-detector: "
                          "1 problem, 2 unknown), nagios (0/1/2/3) (default: "
                          f"{DEFAULT_CONVENTION}; see docs/health.md)")
    state_dir: str | None = opt("--state-dir", metavar="DIR",
                                help="remember Xid lines already reported, IB counters and "
                                "the last verdict here, so old problems are not raised forever")
    expect_gpus: int | None = opt("--expect-gpus", type=count(least=0), metavar="N",
                                  help="FAIL when NVML sees fewer GPUs than this (default: "
                                  "SLURM's GRES, the container's GPUs, else the NVIDIA GPUs "
                                  "on the PCI bus)")
    expect_ib_ports: int | None = opt("--expect-ib-ports", type=count(least=0), metavar="N",
                                      help="FAIL when fewer InfiniBand/RoCE ports than this "
                                      "are active")
    ib_ignore: Sequence[str] | None = opt("--ib-ignore", action="append", metavar="PATTERN",
                                      help="ports not to judge: mlx5_2 or mlx5_2/1, globs "
                                      "allowed, comma-separated or repeated")
    valid_for: float = opt("--valid-for", default=DEFAULT_VALID_FOR_S,
                           type=real(above=0, most=MAX_VALID_FOR_S), metavar="SECONDS",
                           help="the result's valid_until is this far after it was made "
                           f"(default: {DEFAULT_VALID_FOR_S:g})")
    nvml_timeout: float = opt("--nvml-timeout", default=DEFAULT_TIMEOUT_S,
                              type=real(above=0, most=MAX_BUDGET_S), metavar="SECONDS",
                              help="an NVML call answered later than this is slow (a WARN); "
                              f"unanswered 30 s more, hung (default: {DEFAULT_TIMEOUT_S:g})")
    kernel_log: str | None = opt("--kernel-log", metavar="FILE", help="read Xid lines from "
                                 "this saved kernel log instead of this boot's")
    sysfs: str | None = opt("--sysfs", metavar="DIR",
                            help="where sysfs is mounted (a container with the host's at "
                            "/host/sys; default: $GPUCHECK_SYSFS, else /sys)")
    consumer: str = opt("--consumer", default=DEFAULT_CONSUMER, metavar="NAME",
                        help="who reads the state dir (slurm-healthcheck, prometheus, ...): "
                        "each consumer reads the kernel log from its own position, so none "
                        f"takes another's Xid lines (default: {DEFAULT_CONSUMER})")
    set_healthy: bool = opt("--set-healthy", default=False, action="store_true",
                            help="with --state-dir: the remembered faults were dealt with (a "
                            "GPU reset, a part replaced): forget them and every Xid line so far")

    def __post_init__(self) -> None:
        if CONSUMER.fullmatch(self.consumer) is None:
            raise UsageError(f"--consumer {self.consumer!r}: give a short name of letters, "
                             "digits, '.', '_' or '-' (e.g. slurm-healthcheck)")
        if self.set_healthy and self.state_dir is None:
            raise UsageError("--set-healthy needs --state-dir DIR: the state it clears")

    def health_options(self, environ: Mapping[str, str]) -> HealthOptions:
        """The run's options: paths checked, defaults read from `environ`."""
        sysfs = Path(self.sysfs) if self.sysfs is not None else sysfs_root(environ)
        if not sysfs.is_dir():
            raise UsageError(f"--sysfs {sysfs} is not a directory: give where sysfs is mounted")
        ignore = tuple(p.strip() for item in self.ib_ignore or () for p in item.split(",")
                       if p.strip())
        return HealthOptions(
            budget_s=self.budget, nvml_timeout_s=self.nvml_timeout,
            expect_gpus=self.expect_gpus, ib=IbOptions(self.expect_ib_ports, ignore),
            state_dir=checked_state_dir(self.state_dir),
            kernel_log=checked_kernel_log_path(self.kernel_log, environ),
            valid_for_s=self.valid_for, sysfs=sysfs, consumer=self.consumer,
            set_healthy=self.set_healthy, environ=dict(environ))


add_arguments = HealthArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    options = HealthArgs.of(args).health_options(ctx.launcher_env)
    # The budget counts from the process's start: what a scheduler times is all of it.
    return collect_health_report(options, start_of_run(options.budget_s))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report:
    """A stopped run still says until when its word holds (a Prometheus alert on a
    stale `valid_until` must fire for it too)."""
    import datetime as dt

    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=args.valid_for)
    data = {"valid_until": until.isoformat(timespec="seconds"), "unfinished": ["all"]}
    return Report(command="health", sections=[Section("health", "Health check run", data)])


def exit_code(report: Report, args: argparse.Namespace) -> int:
    """The exit code `--convention` reads right (docs/health.md, "Exit codes")."""
    verdict = report.verdict()
    health = report.section("health")
    # Unknown: a check did not finish, or every one was skipped (a problem found wins).
    unknown = bool(health is not None and health.data.get("unfinished")) or \
        verdict is Status.SKIP
    if args.convention == "nagios":
        return {Status.FAIL: 2, Status.WARN: 1}.get(verdict, 3 if unknown else 0)
    if verdict is Status.FAIL or (args.strict and verdict is Status.WARN):
        return 1
    return 2 if args.convention == "npd" and unknown else 0
