"""The import layers of docs/DESIGN.md 2.6, read with ast: every import counts, wherever
it sits (in a function, under TYPE_CHECKING). ruff's banned-api rule keeps render out of
probes and workers; this table holds the rest."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpucheck"

# Floor 1: these import nothing of gpucheck but each other (a Metric names its Subject).
FLOOR_ONE = tuple(f"gpucheck.{name}" for name in
                  ("stats", "measure", "subject", "errors", "escape", "envfacts",
                   "records"))

# (modules the rule covers, by prefix; imports they must not make, by prefix; why)
RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("gpucheck.bench",), ("gpucheck.stress", "gpucheck.comm"),
     "bench imports neither stress nor comm (shared code lives in stats/peers)"),
    (("gpucheck.stress",), ("gpucheck.comm",), "stress does not import comm"),
    (("gpucheck.comm",), ("gpucheck.stress", "gpucheck.bench"),
     "comm imports neither stress nor bench"),
    (("gpucheck.distributed", "gpucheck.bench.worker", "gpucheck.stress.worker",
      "gpucheck.stress.rank", "gpucheck.stress.copies",
      "gpucheck.comm.worker", "gpucheck.preflight.worker"), ("gpucheck.render",),
     "the ranks and the launch layer never render"),
    (("gpucheck.analysis",), ("torch", "gpucheck.distributed", "gpucheck.bench",
                              "gpucheck.comm", "gpucheck.stress"),
     "the report readers work on report files only: no torch, no launch or load layer"),
    (("gpucheck.render",), ("gpucheck.analysis",), "render draws reports, never analyses"),
)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _covers(prefix: str, name: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of each import in one file, relative ones resolved."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # `from gpucheck import render` imports gpucheck.render.
            for alias in node.names:
                yield node.lineno, f"{name}.{alias.name}"


def violations(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        for line, name in imports_of(path, root):
            for owners, banned, why in RULES:
                if any(_covers(owner, module) for owner in owners) and \
                        any(_covers(prefix, name) for prefix in banned):
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{line} imports {name}: {why}")
            if module in FLOOR_ONE and _covers("gpucheck", name) and \
                    not any(_covers(floor, name) for floor in FLOOR_ONE):
                where = path.relative_to(root.parent)
                found.append(f"{where}:{line} imports {name}: floor 1 imports only floor 1")
    return found


def test_no_import_crosses_a_layer() -> None:
    assert violations() == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("bench/pace.py", "from gpucheck.stress.timing import percentile\n", "gpucheck.stress"),
    ("analysis/facts.py", "from gpucheck.distributed import nodes\n",
     "gpucheck.distributed"),
    ("analysis/noise.py", "def f():\n    import torch\n", "torch"),
    ("render/text.py", "from ..analysis import compare\n", "gpucheck.analysis"),
    ("comm/worker.py", "from gpucheck import render\n", "gpucheck.render"),
    ("stats.py", "from gpucheck.report import Finding\n", "gpucheck.report"),
    ("bench/pace.py", "from gpucheck.stats import percentile\n", None),
    ("analysis/facts.py", "from gpucheck.envfacts import node_facts\n", None),
    ("render/text.py", "from gpucheck.report import Report\n", None),
    ("stats.py", "import math\n", None),
    ("measure.py", "from gpucheck.subject import Subject\n", None),
])
def test_a_crossing_is_caught_and_named_and_an_allowed_import_passes(
        tmp_path: Path, module: str, source: str, expected: str | None) -> None:
    target = tmp_path / "gpucheck" / module
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source, encoding="utf-8")
    found = violations(tmp_path / "gpucheck")
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and f"imports {expected}" in found[0], found
        assert found[0].startswith(f"gpucheck/{module}:")


def circles(root: Path = PACKAGE) -> list[list[str]]:
    """Modules that import each other in a loop (a package's __init__ counts as a module;
    an import of a name inside a module is an import of that module)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    arrows = {m: {t for _, n in imports_of(p, root) if (t := target(n)) not in (None, m)}
              for m, p in modules.items()}
    found, done = [], set()
    for start in sorted(modules):
        path, seen = [start], {start}
        stack = [iter(sorted(arrows[start]))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                done.add(seen_last := path.pop())
                seen.discard(seen_last)
            elif step in seen:
                found.append(path[path.index(step):])
            elif step not in done:
                path.append(step)
                seen.add(step)
                stack.append(iter(sorted(arrows[step])))
    return found


def test_no_modules_import_each_other_in_a_loop() -> None:
    assert circles() == []


def test_a_loop_of_imports_is_caught_and_named(tmp_path: Path) -> None:
    package = tmp_path / "gpucheck" / "probes"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from gpucheck.probes.b import X\n", encoding="utf-8")
    (package / "b.py").write_text("if 0:\n    from gpucheck.probes.a import Y\n",
                                  encoding="utf-8")
    (package / "c.py").write_text("from gpucheck.probes import a\n", encoding="utf-8")
    assert circles(tmp_path / "gpucheck") == [["gpucheck.probes.a", "gpucheck.probes.b"]]
