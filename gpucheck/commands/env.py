"""`gpucheck env`: OS, Python, PyTorch, CUDA/cuDNN/NCCL, driver and GPU health.

torch and pynvml are imported only inside the probes, never by this module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpucheck.commands.options import Options, opt, positive_float
from gpucheck.context import RunContext
from gpucheck.probes.kernel_log import checked_kernel_log_path
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S
from gpucheck.probes.runner import collect_env_report, with_env_metrics
from gpucheck.render import format_for
from gpucheck.report import Report

TICKET_FORMATS = {"markdown", "markdown-plain", "html"}
HELP = "probe OS, Python, PyTorch, CUDA/cuDNN/NCCL, driver and GPU health"


@dataclass(frozen=True)
class EnvArgs(Options):
    gpu_test: bool = opt("--no-gpu-test", default=True, action="store_false",
                         help="skip the quick functional test of every visible GPU (matmul "
                         "check and pinned copy bandwidth, ~1 s per GPU)")
    nvml_timeout: float = opt("--nvml-timeout", default=DEFAULT_TIMEOUT_S, type=positive_float,
                              metavar="SECONDS", help="give up on an NVML call after this "
                              f"long (default: {DEFAULT_TIMEOUT_S:g})")
    kernel_log: str | None = opt("--kernel-log", metavar="FILE",
                                 help="read Xid errors from this saved kernel log (dmesg, "
                                 "journalctl -k, kern.log; .gz too) instead of this boot's log")


add_arguments = EnvArgs.add_to


def check(args: argparse.Namespace, ctx: RunContext) -> str | None:
    """The saved kernel log to read, checked before anything runs (`all` too)."""
    return checked_kernel_log_path(args.kernel_log, ctx.launcher_env)


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    from gpucheck.distributed.nodes import gather_env_reports

    options = EnvArgs.of(args)
    kernel_log = check(args, ctx)
    from gpucheck.distributed import progress

    progress.say(ctx, "env: probing this machine (system, Python, torch, NVML, each GPU)")
    # Under torchrun/srun with several ranks: each node's local rank 0 probes, rank 0
    # compares the nodes (gpucheck.distributed.nodes); otherwise just this machine.
    # The environment listed is the one the run was given (`all --local`'s has no
    # launcher variables).
    report = gather_env_reports(lambda: collect_env_report(
        gpu_test=options.gpu_test, nvml_timeout_s=options.nvml_timeout,
        environ=ctx.launcher_env, kernel_log=kernel_log), ctx)
    if report is not None:
        with_env_metrics(report.sections)
    if report is not None and wants_collect_env(args):
        from gpucheck.probes.system import collect_env_section

        progress.say(ctx, "env: python -m torch.utils.collect_env, for the Markdown/HTML report")
        report.add(collect_env_section())
    return report


def wants_collect_env(args: argparse.Namespace) -> bool:
    """PyTorch's collect_env (seconds) only for a Markdown or HTML report."""
    formats = {getattr(args, "format", None)}
    formats |= {format_for(None, path) for path in getattr(args, "outputs", None) or []}
    single = getattr(args, "output", None)
    if single is not None:
        formats.add(format_for(None, single))
    return bool(formats & TICKET_FORMATS)
