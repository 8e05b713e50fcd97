"""Run one gpucheck command line with planted test faults: `python tests/hooked.py
[FAULTS] gpucheck COMMAND ARGS...` (also as the script torchrun starts on every rank).
The word `gpucheck` separates the faults from the command line: torchrun's own parser
swallows a `--` there. The faults are a `plant.Plant` (tests/plant.py).

FAULTS:
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
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # plant and the hook modules

from plant import Plant, SlowNode, SlowPair, function, planted


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


def parse(argv: list[str]) -> tuple[Plant, list[str]]:
    """The faults before the word `gpucheck`, and the gpucheck command line after it."""
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
    return Plant(model=ns.model, stress=ns.stress, fault_bus=ns.fault_bus,
                 slow_pairs=ns.slow_pair, slow_sends=ns.slow_sends,
                 slow_recvs=ns.slow_recvs, hang_margin_s=ns.hang_margin), argv[split + 1:]


def main(argv: list[str]) -> int:
    from gpucheck.cli import main

    plant, command = parse(argv)
    with planted(plant):
        return main(command)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
