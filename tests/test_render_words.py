"""The second look and the hint in words: one wording for text, Markdown and HTML."""

from __future__ import annotations

import pytest

from gpucheck import subject
from gpucheck.measure import Better, Bound, LookState, SecondLook
from gpucheck.render import render
from gpucheck.render.words import UNSTABLE_ADVICE, look_words, message_words
from gpucheck.report import Report, Section, looked, ok, warn

BOUND = Bound.fraction(0.7, Better.HIGHER)


def _look(state: LookState, again: float | None = 41.0, **more: object) -> SecondLook:
    return SecondLook(40.0, again, 80.0, (subject.pair(2, 5),), "GB/s", BOUND, state,
                      **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(("look", "words"), [
    (_look(LookState.CONFIRMED), "confirmed: measured again at 41 GB/s beside rank 2 -> rank 5 "
     "(reference 80 GB/s)"),
    (_look(LookState.UNSTABLE, 79.0), "unstable: measured again at 79 GB/s beside rank 2 -> "
     f"rank 5 (reference 80 GB/s); {UNSTABLE_ADVICE}"),
    (_look(LookState.NOT_MEASURED, None, why_not="the run ended first"),
     "not measured again (the run ended first)")])
def test_a_look_names_the_second_figure_its_peers_and_the_reference_or_why_not(
        look: SecondLook, words: str) -> None:
    assert look_words(look) == words


def test_a_shared_node_words_each_pair() -> None:
    parts = (_look(LookState.CONFIRMED), _look(LookState.UNSTABLE, 79.0))
    shared = SecondLook(40.0, None, 80.0, (), "GB/s", BOUND, LookState.CONFIRMED, parts=parts)
    words = look_words(shared)
    assert words.startswith("confirmed [confirmed: measured again at 41 GB/s")
    assert "unstable: measured again at 79 GB/s" in words


@pytest.mark.parametrize("form", ["text", "markdown", "html"])
def test_every_renderer_words_the_look_and_shows_the_plain_hint(form: str) -> None:
    finding = warn("comm.pairwise.slow_pair", "cuda:2 -> cuda:5 at 40 GB/s",
                   "check the NVLink", subject.pair(2, 5, by="cuda"),
                   look=_look(LookState.NOT_MEASURED, None, why_not="the run ended first"))
    cleared = looked("comm.pairwise.slow_pair", "cuda:3 -> cuda:4 at 40 GB/s", "h",
                     subject.pair(3, 4, by="cuda"), _look(LookState.UNSTABLE, 79.0))
    assert (finding.action, cleared.status.value) == ("rerun", "OK")
    page = " ".join(render(Report("comm", [Section("s", "S", findings=[finding, cleared])]),
                           form).split())  # the text form wraps
    assert "not measured again (the run ended first)" in page
    assert "unstable: measured again at 79 GB/s" in page and UNSTABLE_ADVICE not in page
    assert "check the NVLink" in page and "drain-node" not in page


def test_the_hint_is_plain_advice_whatever_its_words() -> None:
    # No prefix is parsed: a hint that looks like one stays as written, deciding nothing.
    worded = warn("bench.rank.straggler", "m", "action: drain-node: look", cause="host_stall")
    assert worded.action == "fix-config"
    text = render(Report("bench", [Section("s", "S", findings=[worded])]), "text")
    assert "HINT (fix-config): action: drain-node: look" in text


def test_an_ok_that_kept_an_unstable_look_asks_for_nothing() -> None:
    look = _look(LookState.UNSTABLE, 79.0)
    kept = ok("bench.rank.straggler", "within the bar over both loops", look=look)
    assert UNSTABLE_ADVICE not in message_words(kept)
    assert "unstable: measured again at 79" in message_words(kept)
    assert UNSTABLE_ADVICE in look_words(look)
