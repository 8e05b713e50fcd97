"""The command registry is the one place commands are listed; no command imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

from gpucheck.commands import registry

COMMANDS_DIR = Path(__file__).resolve().parents[1] / "gpucheck" / "commands"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_command_module_imports_the_cli() -> None:
    offenders = [p.name for p in sorted(COMMANDS_DIR.glob("*.py"))
                 if "gpucheck.cli" in _imported_modules(p)]
    assert offenders == []


def test_every_registered_command_has_a_module_with_the_command_interface() -> None:
    for name in registry.COMMANDS:
        module = registry.command_module(name)
        assert isinstance(module.HELP, str) and module.HELP
        assert callable(module.add_arguments) and callable(module.run)


def test_unknown_command_name_is_refused_by_the_registry() -> None:
    try:
        registry.command_module("os")
    except KeyError as exc:
        assert "os" in str(exc)
    else:
        raise AssertionError("an unregistered name must not import a module")
