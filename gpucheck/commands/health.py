"""`gpucheck health`: the node check a scheduler or a monitor runs every few minutes.

Never imports torch (nor does anything it imports): it runs before a job's
environment exists, and a broken torch changes nothing. The checks live in
`gpucheck.health`; docs/health.md has the recipes (SLURM, node-problem-detector,
Prometheus) and the rules.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from gpucheck.commands.option_types import finite_float, integer
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.health.budget import start_of_run
from gpucheck.health.conventions import CONVENTIONS, DEFAULT_CONVENTION
from gpucheck.health.conventions import exit_code as convention_exit_code
from gpucheck.health.ib_judge import IbOptions
from gpucheck.health.run import (
    DEFAULT_BUDGET_S,
    DEFAULT_VALID_FOR_S,
    HealthOptions,
    collect_health_report,
)
from gpucheck.health.schema import CONSUMER
from gpucheck.health.state import DEFAULT_CONSUMER, checked_state_dir
from gpucheck.probes.gpu_read import sysfs_root
from gpucheck.probes.kernel_log import checked_kernel_log_path
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S
from gpucheck.report import Report, Section

HELP = ("fast node health for schedulers and monitors (NVML, Xid since the last check, "
        "InfiniBand ports) under a time budget; never imports torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=finite_float, default=DEFAULT_BUDGET_S,
                        metavar="SECONDS",
                        help="never take longer than this: what has not finished is a SKIP "
                             f"(default: {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--convention", choices=CONVENTIONS, default=DEFAULT_CONVENTION,
                        help="exit codes for: slurm (1 on FAIL), npd (node-problem-detector: "
                             "1 problem, 2 unknown), nagios (0/1/2/3) (default: "
                             f"{DEFAULT_CONVENTION}; see docs/health.md)")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="remember Xid lines already reported, IB counters and the last "
                             "verdict here, so old problems are not raised forever")
    parser.add_argument("--expect-gpus", type=integer, metavar="N", default=None,
                        help="FAIL when NVML sees fewer GPUs than this (default: SLURM's "
                             "GRES, the container's GPUs, else the NVIDIA GPUs on the PCI bus)")
    parser.add_argument("--expect-ib-ports", type=integer, metavar="N", default=None,
                        help="FAIL when fewer InfiniBand/RoCE ports than this are active")
    parser.add_argument("--ib-ignore", action="append", default=[], metavar="PATTERN",
                        help="ports not to judge: mlx5_2 or mlx5_2/1, globs allowed, "
                             "comma-separated or repeated")
    parser.add_argument("--valid-for", type=finite_float, default=DEFAULT_VALID_FOR_S,
                        metavar="SECONDS", help="the result's valid_until is this far after "
                        f"it was made (default: {DEFAULT_VALID_FOR_S:g})")
    parser.add_argument("--nvml-timeout", type=finite_float, default=DEFAULT_TIMEOUT_S,
                        metavar="SECONDS", help="an NVML call answered later than this is "
                        "slow (a WARN); unanswered 30 s more, hung (default: "
                        f"{DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--kernel-log", metavar="FILE", default=None,
                        help="read Xid lines from this saved kernel log instead of this boot's")
    parser.add_argument("--sysfs", metavar="DIR", default=None,
                        help="where sysfs is mounted (a container with the host's at "
                             "/host/sys; default: $GPUCHECK_SYSFS, else /sys)")
    parser.add_argument("--consumer", metavar="NAME", default=DEFAULT_CONSUMER,
                        help="who reads the state dir (slurm-healthcheck, prometheus, ...): "
                             "each consumer reads the kernel log from its own position, so "
                             f"none takes another's Xid lines (default: {DEFAULT_CONSUMER})")
    parser.add_argument("--set-healthy", action="store_true",
                        help="with --state-dir: the remembered faults were dealt with (a GPU "
                             "reset, a part replaced): forget them and every Xid line so far")


# Upper bounds: SLURM kills a HealthCheckProgram after 60 s and node-problem-detector a
# plugin after its timeout, so an hour is already far past any use; beyond these,
# threading's timeouts overflow (--budget 1e10) and datetime does (--valid-for 1e12).
MAX_BUDGET_S = 3600.0
MAX_NVML_TIMEOUT_S = 3600.0
MAX_VALID_FOR_S = 366 * 86400.0


def _positive(value: float, option: str, most: float) -> float:
    if not value > 0:
        raise UsageError(f"{option} must be a positive number of seconds, not {value:g}")
    if value > most:
        raise UsageError(f"{option} {value:g} is too long: give at most {most:.0f} seconds")
    return value


def _consumer(name: str, set_healthy: bool, state_dir: str | None) -> str:
    if CONSUMER.fullmatch(name) is None:
        raise UsageError(f"--consumer {name!r}: give a short name of letters, digits, "
                         "'.', '_' or '-' (e.g. slurm-healthcheck)")
    if set_healthy and state_dir is None:
        raise UsageError("--set-healthy needs --state-dir DIR: the state it clears")
    return name


def _count(value: int | None, option: str) -> int | None:
    if value is not None and value < 0:
        raise UsageError(f"{option} must be 0 or more, not {value}")
    return value


def options_from(args: argparse.Namespace,
                 environ: Mapping[str, str] | None = None) -> HealthOptions:
    """The checked options; UsageError (exit 2) for any that cannot be used."""
    consumer = _consumer(args.consumer, args.set_healthy, args.state_dir)
    sysfs = Path(args.sysfs) if args.sysfs is not None else sysfs_root(environ or {})
    if not sysfs.is_dir():
        raise UsageError(f"--sysfs {sysfs} is not a directory: give where sysfs is mounted")
    ignore = tuple(p.strip() for item in args.ib_ignore for p in item.split(",") if p.strip())
    return HealthOptions(
        budget_s=_positive(args.budget, "--budget", MAX_BUDGET_S),
        nvml_timeout_s=_positive(args.nvml_timeout, "--nvml-timeout", MAX_NVML_TIMEOUT_S),
        expect_gpus=_count(args.expect_gpus, "--expect-gpus"),
        ib=IbOptions(_count(args.expect_ib_ports, "--expect-ib-ports"), ignore),
        state_dir=checked_state_dir(args.state_dir),
        kernel_log=checked_kernel_log_path(args.kernel_log, environ),
        valid_for_s=_positive(args.valid_for, "--valid-for", MAX_VALID_FOR_S), sysfs=sysfs,
        consumer=consumer, set_healthy=args.set_healthy, environ=dict(environ or {}))


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    options = options_from(args, ctx.launcher_env)
    # The budget counts from the process's start: what a scheduler times is all of it.
    return collect_health_report(options, start_of_run(options.budget_s))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report:
    """A run stopped (SIGTERM, a scheduler's timeout) still says until when its word
    holds, as a finished one does: a Prometheus alert on a stale `valid_until` must
    fire for it too."""
    import datetime as dt

    try:
        valid_for = _positive(args.valid_for, "--valid-for", MAX_VALID_FOR_S)
    except UsageError:
        valid_for = DEFAULT_VALID_FOR_S
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=valid_for)
    data = {"valid_until": until.isoformat(timespec="seconds"), "unfinished": ["all"]}
    return Report(command="health", sections=[Section("health", "Health check run", data)])


def exit_code(report: Report, args: argparse.Namespace) -> int:
    """The exit code `--convention` reads right (gpucheck.health.conventions)."""
    return convention_exit_code(report, args.convention, args.strict)
