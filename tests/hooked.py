"""Run one gpucheck command line with test hooks: `python tests/hooked.py [HOOKS]
gpucheck COMMAND ARGS...` (also as the script torchrun starts on every rank). The
word `gpucheck` separates the hooks from the command line: torchrun's own parser
swallows a `--` there.

The hooks (gpucheck.context.TestHooks) travel as data: this test-only entry point
builds them and calls `gpucheck.cli.program`, which hands them to every rank with
the job spec. gpucheck itself reads no hook from the environment.

HOOKS:
  --model MODULE:FUNCTION     bench: function(model, rank) -> model (tests/bench_workers.py)
  --stress MODULE:FUNCTION    stress: function(rank, phase, iteration, out)
  --fault-bus ID,ID,...       per rank, a PCI bus id watched instead of its GPU ("" none)
  --slow-pair SRC:DST:SECONDS[:WHEN][,...]   WHEN: always, first, once
  --slow-sends NODE[/RAIL]:SECONDS[:first]
  --slow-recvs NODE[/RAIL]:SECONDS[:first]
  --hang-margin SECONDS       preflight: the hang guard's margin (default 30 s)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from gpucheck.context import RunOptions, SlowNode, SlowPair, TestHooks


def function(target: str) -> Any:
    """`module:function` (test code: the tests directory is on the path)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def slow_pairs(text: str) -> tuple[SlowPair, ...]:
    pairs = []
    for spec in filter(None, text.split(",")):
        src, dst, seconds, *when = spec.split(":")
        pairs.append(SlowPair(int(src), int(dst), float(seconds), *when))
    return tuple(pairs)


def slow_node(text: str) -> SlowNode:
    where, _, rest = text.partition(":")
    node, _, rail = where.partition("/")
    seconds, _, when = rest.partition(":")
    return SlowNode(int(node), float(seconds), int(rail) if rail else None, when == "first")


def fault_bus(text: str) -> tuple[str | None, ...]:
    return tuple(b.strip() or None for b in text.split(","))


SEPARATOR = "gpucheck"


def parse(argv: list[str]) -> tuple[TestHooks, list[str]]:
    """The hooks before the word `gpucheck`, and the gpucheck command line after it."""
    split = argv.index(SEPARATOR) if SEPARATOR in argv else len(argv)
    parser = argparse.ArgumentParser(prog="hooked.py")
    parser.add_argument("--model", type=function)
    parser.add_argument("--stress", type=function)
    parser.add_argument("--fault-bus", type=fault_bus, default=())
    parser.add_argument("--slow-pair", type=slow_pairs, default=())
    parser.add_argument("--slow-sends", type=slow_node)
    parser.add_argument("--slow-recvs", type=slow_node)
    parser.add_argument("--hang-margin", type=float)
    ns = parser.parse_args(argv[:split])
    return TestHooks(model=ns.model, stress=ns.stress, fault_bus=ns.fault_bus,
                     slow_pairs=ns.slow_pair, slow_sends=ns.slow_sends,
                     slow_recvs=ns.slow_recvs, hang_margin_s=ns.hang_margin), argv[split + 1:]


def main(argv: list[str]) -> int:
    from gpucheck.cli import program

    hooks, command = parse(argv)
    return program(command, RunOptions(hooks=hooks))


if __name__ == "__main__":
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # the hook modules (bench_workers, stress_workers)
        sys.path.insert(0, here)
    raise SystemExit(main(sys.argv[1:]))
