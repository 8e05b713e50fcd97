"""`gpucheck all`: env, stress, bench and comm in turn, every option checked first, one
report; a command that fails is a FAIL `all.<cmd>.failed` and the next runs (docs/all.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpucheck.commands.launch import LaunchOptions
from gpucheck.commands.options import opt, positive_float
from gpucheck.context import AllRun, Outcome, RunContext
from gpucheck.distributed import progress
from gpucheck.distributed.world import reports
from gpucheck.errors import UsageError
from gpucheck.escape import terminal as shown
from gpucheck.report import Report, Section, fail, skip
from gpucheck.subject import text

HELP = "env, stress, bench and comm in turn on this node (or job): one report"

ORDER = ("env", "stress", "bench", "comm")
# CPU ranks get short settings (the run near a minute, docs/all.md); GPUs the defaults.
CPU_SETTINGS: dict[str, tuple[str, ...]] = {
    "stress": ("--duration", "2"),
    "comm": ("--max-bytes", "64K", "--iters", "5"),
}
# What `--local` leaves out of the commands' environment: this node runs as its own job.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")


@dataclass(frozen=True)
class AllArgs(LaunchOptions):
    skip: str = opt("--skip", default="", group="all", metavar="LIST",
                    help=f"commands not to run, comma-separated: {', '.join(ORDER)}")
    duration: float | None = opt("--duration", group="all", type=positive_float,
                                 metavar="SECONDS", help="stress's burn-in length (default: "
                                 f"stress's, 30 on GPU; {CPU_SETTINGS['stress'][1]} on CPU)")
    local: bool = opt("--local", default=False, group="all", action="store_true",
                      help="ignore torchrun's and SLURM's rank variables: run this node alone, "
                      "e.g. one srun task per node (docs/all.md)")


add_arguments = AllArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    skipped = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = sorted(skipped - set(ORDER))
    if unknown:
        raise UsageError(f"--skip {args.skip!r}: unknown command(s) {', '.join(unknown)}; "
                         f"use {', '.join(ORDER)}")
    chosen = tuple(n for n in ORDER if n not in skipped)
    if not chosen:
        raise UsageError(f"--skip {args.skip!r} leaves nothing to run")
    if args.local:  # on the run's own context: the CLI's stop report sees it too
        ctx.launcher_env = {k: v for k, v in ctx.launcher_env.items()
                            if k not in LAUNCHER_VARS}
    namespaces, device = _namespaces(args, chosen, ctx)
    state = ctx.all_run = AllRun(namespaces=namespaces)
    for name in ORDER:
        if name not in chosen:
            state.outcomes.append(Outcome(name, "skipped", "--skip"))
            continue
        progress.say(ctx, f"all: step {chosen.index(name) + 1} of {len(chosen)}: gpucheck {name}")
        state.outcomes.append(_run_one(name, namespaces[name], ctx))
        state.current = None  # left set by an interrupt, for partial_report
    outcomes: list[Outcome] = state.outcomes
    if not reports(ctx):
        if any(o.outcome == "failed" for o in outcomes):
            raise SystemExit(1)  # the launcher should know this rank failed
        return None
    report = combined_report(outcomes)
    if device == "cpu":  # on a node that should have GPUs, CPU ranks are no pass
        from gpucheck.devices import expected_gpus, sysfs_root
        from gpucheck.probes.gpu_judge import cpu_ranks_finding

        environ = ctx.launcher_env
        found = cpu_ranks_finding(expected_gpus(environ, sysfs_root(environ)),
                                  args.device == "cpu")
        report.sections[0].findings += [found] if found is not None else []
    return report


def _namespaces(args: argparse.Namespace, chosen: tuple[str, ...],
                ctx: RunContext) -> tuple[dict[str, Any], str | None]:
    """Each chosen command's options from its own parser, checked before anything runs,
    and where the ranks compute (None when only env runs)."""
    from gpucheck.commands.launch import plan_launch
    from gpucheck.commands.registry import command_module

    launched = [n for n in chosen if n != "env"]
    device = plan_launch(args, ctx).device if launched else None
    namespaces = {}
    for name in chosen:
        argv = _sub_argv(name, args, device)
        namespace = _parse(argv)
        try:  # each command's own checks, before anything runs
            command_module(name).check(namespace, ctx)
        except UsageError as exc:
            raise UsageError(f"{name} ({' '.join(argv)}): {exc}") from None
        if name == "env":  # `all -o ticket.md`: env's collect_env, as `env -o ticket.md`
            namespace.format, namespace.outputs = args.format, list(args.outputs or [])
        namespaces[name] = namespace
    return namespaces, device


def _sub_argv(name: str, args: argparse.Namespace, device: str | None) -> list[str]:
    """`all`'s options as the command line of one command."""
    argv = [name, *(["--quiet"] if args.quiet else [])]
    if name == "env":
        return argv
    for flag, value in (("--n-gpus", args.n_gpus), ("--device", args.device),
                        ("--backend", args.backend), ("--master-port", args.master_port)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--timeout", repr(args.timeout)]
    if not args.fault_watch:
        argv.append("--no-fault-watch")
    if device == "cpu":
        argv += CPU_SETTINGS.get(name, ())
    if name == "stress" and args.duration is not None:
        argv += ["--duration", repr(args.duration)]  # the later value wins in argparse
    return argv


def _parse(argv: list[str]) -> argparse.Namespace:
    from gpucheck import __version__
    from gpucheck.commands.registry import build_parser

    return build_parser(__version__).parse_args(argv)


def _run_one(name: str, ns: argparse.Namespace, ctx: RunContext) -> Outcome:
    """Run one command; its failure is an outcome, not the end of `all`."""
    from gpucheck.commands.registry import command_module

    ctx.all_run.current = name
    start = time.monotonic()
    try:  # each command's process group on its own part of the job's store
        report = command_module(name).run(ns, ctx.scoped(name))
    except SystemExit as exc:  # a rank > 0 whose job failed; it said why on stderr
        why = f"this rank exited with status {exc.code}"
        return Outcome(name, "failed", why, _since(start))
    except Exception as exc:
        from gpucheck.distributed.session import first_line

        why = f"{type(exc).__name__}: {first_line(str(exc))}"
        try:  # leave a group the failed command left joined, so the next can join its own
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception as left:  # a broken group: said beside the failure, not hidden
            why += f"; its process group could not be left ({type(left).__name__})"
        print(f"gpucheck all: {name} failed: {shown(why)}", file=sys.stderr)
        return Outcome(name, "failed", why, _since(start))
    if report is None and reports(ctx):
        return Outcome(name, "failed", "it returned no report", _since(start))
    return Outcome(name, "ran", "", _since(start), report)


def _since(start: float) -> float:
    return round(time.monotonic() - start, 1)


def combined_report(outcomes: list[Outcome]) -> Report:
    """The summary first, then every command's sections, named `<cmd>.<section>`."""
    report = Report(command="all", scope=narrowest_scope(outcomes))
    report.add(summary_section(outcomes))
    for outcome in outcomes:
        for section in outcome.report.sections if outcome.report else []:
            report.add(prefixed(outcome.command, section))
    return shown_once(report, "thresholds")


def narrowest_scope(outcomes: list[Outcome]) -> str | None:
    """A report covers no more than its narrowest part: every command's scope, once."""
    scopes = {o.report.scope: o.command for o in reversed(outcomes)
              if o.report is not None and o.report.scope}
    ordered = sorted(scopes.items(), key=lambda item: ORDER.index(item[1])
                     if item[1] in ORDER else len(ORDER))
    if len(ordered) == 1:
        return ordered[0][0]
    return "; ".join(f"{command}: {scope}" for scope, command in ordered) or None


def shown_once(report: Report, key: str) -> Report:
    """A value every load command repeats (the fault watch's thresholds) is shown in the
    first section that has it; later ones point there."""
    first: dict[str, str] = {}  # the value's JSON form -> the title of the first section
    for section in report.sections:
        if key not in section.data:
            continue
        value = json.dumps(section.data[key], sort_keys=True)
        if value in first:
            section.data = {**section.data, key: f"as in {first[value]}"}
        else:
            first[value] = section.title
    return report


def prefixed(command: str, section: Section) -> Section:
    return Section(f"{command}.{section.name}", f"{command}: {section.title}",
                   section.data, section.findings, section.metrics)


def summary_section(outcomes: list[Outcome]) -> Section:
    """One row per command, and a finding for each that failed or was skipped."""
    rows, findings = [], []
    for o in outcomes:
        counts = o.report.summary() if o.report else {}
        rows.append({"command": o.command, "outcome": o.outcome,
                     "verdict": o.report.verdict().value if o.report else "-",
                     **{status: counts.get(status, 0) for status in ("FAIL", "WARN", "OK")},
                     "wall_s": o.wall_s, "why": o.why})
        if o.outcome == "failed":
            findings.append(fail(
                f"all.{o.command}.failed", f"gpucheck {o.command} did not finish: {o.why}; "
                "the other commands still ran", hint=f"read its error above, then run "
                f"`gpucheck {o.command}` alone to see it in full", subject=text(o.command)))
        elif o.outcome in ("skipped", "not run"):
            findings.append(skip(f"all.{o.command}.{o.outcome.replace(' ', '_')}",
                                 f"gpucheck {o.command} did not run: {o.why}",
                                 subject=text(o.command)))
    ran = sum(o.outcome == "ran" for o in outcomes)
    return Section("summary", "Commands", {"commands_run": f"{ran} of {len(outcomes)}",
                                           "commands": rows}, findings)


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: the commands that finished, what the running one had
    measured, and which never ran."""
    from gpucheck.commands.registry import command_module

    outcomes = list(ctx.all_run.outcomes)
    current = ctx.all_run.current
    if current is not None:
        build = getattr(command_module(current), "partial_report", None)
        ns = ctx.all_run.namespaces.get(current)
        partial = build(ns, ctx) if build is not None and ns is not None else None
        outcomes.append(Outcome(current, "interrupted", "stopped while running",
                                report=partial))
    done = {o.command for o in outcomes}
    outcomes += [Outcome(n, "not run", "the run was stopped before it")
                 for n in ORDER if n not in done]
    return combined_report(outcomes)
