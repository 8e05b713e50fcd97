"""A finding's data in words, the same in text, Markdown and HTML: its second look
(`look_words`) after the message, and its hint without an action prefix (`hint_words`).

The message of a measured finding says the first figure only; what the second look
found is data (`gpucheck.measure.SecondLook`), worded here and nowhere else.
"""

from __future__ import annotations

from gpucheck.measure import LookState, SecondLook
from gpucheck.render.values import fmt_value
from gpucheck.report import Finding

# What an unstable look asks of a person, once for every command.
UNSTABLE_ADVICE = ("not slow the second time: contention from other jobs or a transient; "
                   "run again, and act only if it repeats")


def _figure(value: float | None, unit: str) -> str:
    return f"{fmt_value(value)} {unit}".rstrip()


def look_words(look: SecondLook, advice: bool = True) -> str:
    """"confirmed: measured again at 41 GB/s beside rank 2 -> rank 5 (reference 80 GB/s)";
    a shared node's look adds one clause per slow pair. `advice`: an unstable look's
    "run again" (none for an OK that kept its look: nothing to act on)."""
    beside = f" beside {', '.join(s.label for s in look.against)}" if look.against else ""
    reference = f" (reference {_figure(look.reference, look.unit)})" \
        if look.reference is not None else ""
    if look.state is LookState.NOT_MEASURED:
        words = f"not measured again ({look.why_not})" if look.why_not \
            else "not measured again"
    elif look.again is None:  # a shared node: the parts carry the figures
        words = look.state.value
    else:
        words = f"{look.state.value}: measured again at " \
                f"{_figure(look.again, look.unit)}{beside}{reference}"
    if look.parts:
        words += " [" + "; ".join(look_words(p) for p in look.parts) + "]"
    if look.state is LookState.UNSTABLE and advice:
        words += f"; {UNSTABLE_ADVICE}"
    return words


def message_words(finding: Finding) -> str:
    """The message, then the second look in words when the finding has one."""
    if finding.look is None:
        return finding.message
    return f"{finding.message}; {look_words(finding.look, finding.status.value != 'OK')}"


def hint_words(finding: Finding) -> str | None:
    """The hint a person reads: plain advice (the action is shown on its own)."""
    return finding.hint
