"""The comm verdicts' one way to say "slow": a WARN carrying its second look as data.

Every slow figure of comm (a GPU pair, a node, a node pair, a rail link, a node its
slow links share) is measured again before it is condemned (`gpucheck.peers`); the
finding's message says the first figure, its `look` what the second one did, and the
action follows from the check's `on_look` (gpucheck/checks/runs.py: confirmed drains,
not measured again reruns, unstable is an OK keeping its look). On CPU ranks (gloo
on the host) a slow figure is a busy or throttled process, not a NIC or a GPU: cause
`cpu_ranks`, a rerun, which outranks the look.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpucheck.measure import Better, Bound, SecondLook
from gpucheck.peers import Pair, Suspects
from gpucheck.report import Finding, looked, warn
from gpucheck.stats import best, typical
from gpucheck.subject import Subject

GBPS = "GB/s"
CPU_RANKS = "cpu_ranks"
_CPU_NOTE = " (CPU ranks: a busy or throttled process on the node, not its hardware)"


def rate_bound(fraction: float) -> Bound:
    """Slow below `fraction` x the reference, a rate (higher is better). A cut of 0 (the
    healthy links' own spread swallowed the fabric's fraction, node_links.spread_cut)
    condemns no measured rate: the smallest positive float stands for it, as a Bound
    needs a positive limit (only a rate of exactly 0, which no timing gives, is below)."""
    return Bound(max(fraction, sys.float_info.min), Better.HIGHER) if fraction <= 0 \
        else Bound.fraction(fraction, Better.HIGHER)


def on_cpu(device: str) -> bool:
    """Ranks on the host's CPUs (`--device cpu`, gloo): their figures measure processes."""
    return device == "cpu"


def slow(check: str, text: str, hint: str, subject: Subject, look: SecondLook | None,
         device: str, *, cpu_hint: bool = True) -> Finding:
    """A slow figure's WARN (`gpucheck.report.looked`: an OK when the look cleared it):
    `look` as data, cause `cpu_ranks` on CPU ranks (with a word on the hint unless
    `cpu_hint` is False: the hint already speaks of processes). `look` None: a suspect
    no second figure can be taken for (one rail's slow links sharing a node), its
    action the check's WARN."""
    cpu = on_cpu(device)
    hint += _CPU_NOTE if cpu and cpu_hint else ""
    cause = CPU_RANKS if cpu else None
    if look is None:
        return warn(check, text, hint, subject, cause=cause)
    return looked(check, text, hint, subject, look, cause=cause)


def repeats_words(samples: Sequence[float], pair: Pair, suspects: Suspects) -> str:
    """"0.7 GB/s (median of 3 repeats, best 1.56)", and whether they disagree widely."""
    words = f"{typical(samples):.3g} GB/s (median of {len(samples)} repeats, best " \
            f"{best(samples):.3g})"
    if pair in suspects.intermittent:
        words += f"; intermittent: slow in most repeats, not all ({min(samples):.3g} to " \
                 f"{best(samples):.3g} GB/s)"
    return words
