"""The README lists every command the registry has, in the JSON schema and the layout."""

from __future__ import annotations

from pathlib import Path

from gpucheck.commands.registry import COMMANDS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_schema_comment_lists_every_command() -> None:
    line = next(x for x in README.splitlines() if x.strip().startswith('"command": "env"'))
    assert [c for c in COMMANDS if c not in line] == []


def test_every_command_has_an_example_in_the_commands_block() -> None:
    assert [c for c in COMMANDS if f"gpucheck {c}" not in README] == []
