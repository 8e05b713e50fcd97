"""No hidden state (issue 25, docs/DESIGN.md 2.5): what a run is given comes in through
its RunContext, not module globals or environment variables.

Read by ast over gpucheck/:
- no module-level mutable binding (a list, dict or set display or comprehension, or
  list()/dict()/set()/defaultdict()/deque()/...) except ALL_CAPS constants, which the
  code never changes, and `__all__`; no `global` statement;
- no write to os.environ except the settings of torch and NCCL themselves;
- no GPUCHECK_* name outside the files that only classify environment listings, but
  for the user's own settings, read once where a run starts (cli.py) into its context;
- no importlib.import_module outside commands/registry.py (its fixed command list);
- no reading of the launcher's world from the process's environment (world_from_env
  without an explicit mapping): every caller reads it from the context it was given.

KNOWN lists what is still to move (docs/DESIGN.md section 3, S5); each entry must
still be there (remove it when its move lands), and nothing else may appear.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpucheck"
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "OrderedDict", "Counter",
                 "bytearray"}
MUTABLE_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
ENV_WRITES = {"pop", "update", "setdefault", "clear", "popitem", "__setitem__",
              "__delitem__"}
# Files that set torch's or NCCL's own variables (legitimate: that is their interface).
TORCH_NCCL_SETTINGS = {"distributed/deadline.py",
                       "comm/nccl_log.py"}
# Files that name GPUCHECK_ only to classify an environment listing, never to read it.
OWN_PREFIX_CLASSIFIERS = {"probes/system.py", "distributed/nodes.py", "envfacts.py"}
# The user's settings, read once at the command boundary into RunOptions (file, name).
USER_SETTINGS = {("cli.py", "GPUCHECK_RUN_DIR"),
                 ("devices.py", "GPUCHECK_SYSFS"),  # read from the environ given
                 ("devices.py", "GPUCHECK_EXPECT_GPUS"),
                 ("probes/kernel_log.py", "GPUCHECK_KERNEL_LOG")}  # from the environ given

# Still to move onto the RunContext (each entry: file, what): nothing left.
KNOWN: dict[str, set[tuple[str, str]]] = {"state": set(), "env_write": set(),
                                          "gpucheck_name": set()}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(encoding="utf-8"), str(p)))
            for p in sorted(PACKAGE.rglob("*.py"))]


def _bindings(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    found: list[tuple[str, ast.expr]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            found += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                node.value is not None:
            found.append((node.target.id, node.value))
    return found


def _mutable(value: ast.expr) -> bool:
    return isinstance(value, MUTABLE_DISPLAYS) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        and value.func.id in MUTABLE_CALLS)


def module_state() -> set[tuple[str, str]]:
    return {(path, name) for path, tree in _modules() for name, value in _bindings(tree)
            if _mutable(value) and not name.isupper() and name != "__all__"}


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and \
        isinstance(node.value, ast.Name) and node.value.id == "os"


def _writes_environ(node: ast.AST) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        return any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        return (func.attr in ENV_WRITES and _is_environ(func.value)) or (
            func.attr in ("putenv", "unsetenv") and isinstance(func.value, ast.Name)
            and func.value.id == "os")
    return False


def environment_writes() -> set[tuple[str, str]]:
    return {(path, "os.environ") for path, tree in _modules() if path not in
            TORCH_NCCL_SETTINGS and any(_writes_environ(n) for n in ast.walk(tree))}


def gpucheck_names() -> set[tuple[str, str]]:
    return {(path, n.value) for path, tree in _modules() if path not in OWN_PREFIX_CLASSIFIERS
            for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value.startswith("GPUCHECK_")} - USER_SETTINGS


@pytest.mark.parametrize(("kind", "found"), [
    ("state", module_state), ("env_write", environment_writes),
    ("gpucheck_name", gpucheck_names)])
def test_nothing_hidden_beyond_what_is_known_to_move(kind: str, found: object) -> None:
    assert callable(found)
    seen = found()
    assert seen - KNOWN[kind] == set(), "new hidden state: pass it in the RunContext"
    assert KNOWN[kind] - seen == set(), "moved: remove it from KNOWN"


def test_no_global_statement() -> None:
    assert [path for path, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Global)] == []


def test_only_the_command_registry_imports_by_name() -> None:
    assert {path for path, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr == "import_module"} == {
        "commands/registry.py"}


def test_the_scanner_sees_each_kind_of_hidden_state() -> None:
    code = ast.parse("_seen = {}\nSEEN = {}\n_made = list()\nimport os\n"
                     "os.environ['X'] = '1'\nos.environ.pop('Y', None)\n")
    assert [(n, _mutable(v)) for n, v in _bindings(code)] == [
        ("_seen", True), ("SEEN", True), ("_made", True)]
    assert sum(_writes_environ(n) for n in ast.walk(code)) == 2


def test_the_users_settings_are_read_where_the_run_starts() -> None:
    assert {(path, n.value) for path, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and (path, n.value) in USER_SETTINGS} == USER_SETTINGS


def test_every_reading_of_the_launchers_world_is_given_its_environment() -> None:
    """world_from_env(mapping) only: a call without one would read os.environ wherever
    it sits instead of the context's `launcher_env`."""
    bare = [f"{path}:{n.lineno}" for path, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "world_from_env" and not (n.args or n.keywords)]
    assert bare == []
