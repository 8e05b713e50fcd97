"""`gpucheck env`: OS, Python, PyTorch, CUDA/cuDNN/NCCL, driver and GPU health.

torch and pynvml are imported only inside the probes, never by this module.
"""

from __future__ import annotations

import argparse

from gpucheck.commands.option_types import positive_float
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.probes.kernel_log import checked_kernel_log_path
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S
from gpucheck.probes.runner import collect_env_report, with_env_metrics
from gpucheck.render import format_for
from gpucheck.report import Report

TICKET_FORMATS = {"markdown", "markdown-plain", "html"}
HELP = "probe OS, Python, PyTorch, CUDA/cuDNN/NCCL, driver and GPU health"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-gpu-test", dest="gpu_test", action="store_false",
                        help="skip the quick functional test of every visible GPU "
                             "(matmul check and pinned copy bandwidth, ~1 s per GPU)")
    parser.add_argument("--nvml-timeout", type=positive_float, default=DEFAULT_TIMEOUT_S,
                        metavar="SECONDS",
                        help="give up on an NVML call after this long (default: "
                             f"{DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--kernel-log", metavar="FILE", default=None,
                        help="read Xid errors from this saved kernel log (dmesg, journalctl -k, "
                             "kern.log; .gz too) instead of this boot's log")


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    from gpucheck.distributed.envgather import gather_env_reports

    timeout = getattr(args, "nvml_timeout", DEFAULT_TIMEOUT_S)
    if not timeout > 0:
        raise UsageError(f"--nvml-timeout must be positive, not {timeout}")
    kernel_log = checked_kernel_log_path(getattr(args, "kernel_log", None), ctx.launcher_env)
    from gpucheck.distributed import terminal

    terminal.say(ctx, "env: probing this machine (system, Python, torch, NVML, each GPU)")
    # Under torchrun/srun with several ranks: each node's local rank 0 probes, rank 0
    # compares the nodes (gpucheck.distributed.envgather); otherwise just this machine.
    # The environment listed is the one the run was given (`all --local`'s has no
    # launcher variables).
    report = gather_env_reports(lambda: collect_env_report(
        gpu_test=getattr(args, "gpu_test", True), nvml_timeout_s=timeout,
        environ=ctx.launcher_env, kernel_log=kernel_log), ctx)
    if report is not None:
        with_env_metrics(report.sections)
    if report is not None and wants_collect_env(args):
        from gpucheck.probes.system import collect_env_section

        terminal.say(ctx, "env: python -m torch.utils.collect_env, for the Markdown/HTML report")
        report.add(collect_env_section())
    return report


def wants_collect_env(args: argparse.Namespace) -> bool:
    """PyTorch's collect_env only for a Markdown or HTML report (it takes seconds; the
    terminal report stays as fast): --format, or a -o file's extension."""
    formats = {getattr(args, "format", None)}
    formats |= {format_for(None, path) for path in getattr(args, "outputs", None) or []}
    single = getattr(args, "output", None)
    if single is not None:
        formats.add(format_for(None, single))
    return bool(formats & TICKET_FORMATS)
