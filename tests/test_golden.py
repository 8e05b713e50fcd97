"""Canned reports rendered to text and Markdown, compared with the stored files in
tests/golden/ (regenerate with `python tests/golden/regen.py`, read the diff)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def _regen():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("golden_regen", GOLDEN / "regen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPECTED = _regen().rendered()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rendering_matches_the_stored_golden_file(name: str) -> None:
    stored = (GOLDEN / name).read_text(encoding="utf-8")
    assert EXPECTED[name] == stored, f"rerun tests/golden/regen.py, read the diff of {name}"


def test_every_golden_file_is_still_produced() -> None:
    stored = {p.name for p in GOLDEN.iterdir() if p.suffix in (".txt", ".md")}
    assert stored == set(EXPECTED)
