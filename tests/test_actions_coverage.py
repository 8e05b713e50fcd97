"""Every WARN/FAIL check id in gpucheck/ has an action rule (no fallback today).

A static scan, approximate by design: it finds `warn(...)`/`fail(...)` calls (and
`Finding(..., Status.WARN|FAIL, ...)`) and follows their first argument through
string literals, f-strings (a formatted part it cannot see becomes a `*` segment),
local and module assignments, class constants and, for a function parameter, the
calls of that function elsewhere in the package. Sites that pass `action=`, or
whose hint starts with "action: ", name their action themselves and need no rule.
What the scan cannot follow is listed in UNFOLLOWED, with the ids the site makes,
and checked for drift.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import gpucheck
from gpucheck.actions import RULES, rule_for

PACKAGE = Path(gpucheck.__file__).parent
UNKNOWN = "*"
MAX_DEPTH = 6

# (file under gpucheck/, function) -> the ids its WARN/FAIL can have, for the sites the
# scan cannot follow. Each id's literal tail must appear in that file's source.
UNFOLLOWED: dict[tuple[str, str], tuple[str, ...]] = {
    # check, hint = _CHECKS.get(cause, ("rank_failed", ...)): f"{command}.{check}"
    ("distributed/failures.py", "rank_failure_findings"): (
        "*.rank_unresponsive", "*.checkin", "*.shared_gpu", "*.rank_failed"),
}


@dataclass(frozen=True)
class Site:
    """One warn/fail call: where, which statuses, the ids it can make, explicit or not."""

    file: str
    function: str
    line: int
    statuses: tuple[str, ...]
    ids: frozenset[str]
    explicit: bool

    @property
    def where(self) -> str:
        return f"gpucheck/{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Module:
    name: str  # path under gpucheck/
    tree: ast.Module
    parents: dict[ast.AST, ast.AST]


@cache
def modules() -> tuple[Module, ...]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "report.py":  # warn() and fail() themselves
            continue
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        found.append(Module(str(path.relative_to(PACKAGE)), tree, parents))
    return tuple(found)


def _enclosing(module: Module, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
    while node in module.parents:
        node = module.parents[node]
        if isinstance(node, kinds):
            return node
    return None


def _function(module: Module, node: ast.AST) -> ast.FunctionDef | None:
    found = _enclosing(module, node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return found if isinstance(found, ast.FunctionDef) else None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None


def _assigned(scope: ast.AST, name: str) -> Iterator[ast.expr | None]:
    """The values bound to `name` in `scope` (None where the scan cannot tell)."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name:
                    yield node.value
                elif isinstance(target, ast.Tuple):
                    for i, element in enumerate(target.elts):
                        if isinstance(element, ast.Name) and element.id == name:
                            value = node.value
                            yield value.elts[i] if isinstance(value, ast.Tuple) else None
        elif isinstance(node, ast.For | ast.comprehension) and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target)):
            yield None


def _module_level(module: Module, name: str) -> list[ast.expr | None]:
    return [node.value for node in module.tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]


def _class_constant(module: Module, attr: str) -> list[ast.expr | None]:
    return [node.value for cls in ast.walk(module.tree) if isinstance(cls, ast.ClassDef)
            for node in cls.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets)]


@cache
def _calls() -> dict[str, list[tuple[Module, ast.Call]]]:
    by_name: dict[str, list[tuple[Module, ast.Call]]] = {}
    for module in modules():
        for call in ast.walk(module.tree):
            if isinstance(call, ast.Call) and _callee(call):
                by_name.setdefault(str(_callee(call)), []).append((module, call))
    return by_name


def calls_of(name: str) -> list[tuple[Module, ast.Call]]:
    return _calls().get(name, [])


def _argument_values(function: ast.FunctionDef, name: str) -> Iterator[tuple[Module, ast.expr]]:
    """What the package's calls of `function` pass for its parameter `name`."""
    params = [a.arg for a in function.args.args]
    shift = 1 if params[:1] in (["self"], ["cls"]) else 0
    index = params.index(name) - shift if name in params else -1  # -1: keyword-only
    for module, call in calls_of(function.name):
        keyword = next((k.value for k in call.keywords if k.arg == name), None)
        if keyword is not None:
            yield module, keyword
        elif 0 <= index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            yield module, call.args[index]


def _name_values(module: Module, node: ast.AST, name: str, depth: int) -> set[str]:
    function = _function(module, node)
    if function is not None:
        if name in [a.arg for a in function.args.args + function.args.kwonlyargs]:
            values = {v for m, arg in _argument_values(function, name)
                      for v in strings(m, arg, depth + 1)}
            return values or {UNKNOWN}
        local = list(_assigned(function, name))
        if local:
            return {v for value in local for v in _strings_or_unknown(module, value, depth)}
    bound = _module_level(module, name)
    return {v for value in bound for v in _strings_or_unknown(module, value, depth)} \
        or {UNKNOWN}


def _strings_or_unknown(module: Module, value: ast.expr | None, depth: int) -> set[str]:
    return {UNKNOWN} if value is None else strings(module, value, depth + 1)


def strings(module: Module, expr: ast.expr, depth: int = 0) -> set[str]:
    """The strings `expr` can be, with UNKNOWN for what the scan cannot follow."""
    if depth > MAX_DEPTH:
        return {UNKNOWN}
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.JoinedStr):
        parts = [{v.value} if isinstance(v, ast.Constant) else
                 strings(module, v.value, depth + 1) if isinstance(v, ast.FormattedValue)
                 else {UNKNOWN} for v in expr.values]
        return {"".join(p) for p in itertools.product(*parts)}
    if isinstance(expr, ast.IfExp):
        return strings(module, expr.body, depth + 1) | strings(module, expr.orelse, depth + 1)
    if isinstance(expr, ast.Name):
        return _name_values(module, expr, expr.id, depth)
    if isinstance(expr, ast.Attribute):
        return {v for value in _class_constant(module, expr.attr)
                for v in _strings_or_unknown(module, value, depth)} or {UNKNOWN}
    return {UNKNOWN}


def _as_id(text: str) -> str:
    """A segment with anything unknown in it is unknown as a whole."""
    return ".".join(UNKNOWN if UNKNOWN in s else s for s in text.split("."))


def _maker_statuses(module: Module, call: ast.Call) -> tuple[str, ...]:
    """WARN/FAIL for warn(), fail(), Finding(.., Status.X, ..) and a local bound to them
    (`verdict = fail if ... else warn`); () for any other call."""
    names = {"warn": ("WARN",), "fail": ("FAIL",)}
    callee = _callee(call)
    if callee in names:
        return names[callee]
    if callee == "Finding" and len(call.args) > 1 and isinstance(call.args[1], ast.Attribute) \
            and call.args[1].attr in ("WARN", "FAIL"):
        return (call.args[1].attr,)
    function = _function(module, call)
    if isinstance(call.func, ast.Name) and function is not None:
        bound = [v for v in _assigned(function, call.func.id) if v is not None]
        aliases = {n.id for v in bound for n in ast.walk(v) if isinstance(n, ast.Name)}
        if bound and aliases & set(names):
            return tuple(s for alias in sorted(aliases & set(names)) for s in names[alias])
    return ()


def _hint(call: ast.Call) -> ast.expr | None:
    keyword = next((k.value for k in call.keywords if k.arg == "hint"), None)
    return keyword if keyword is not None else call.args[2] if len(call.args) > 2 else None


def _names_its_action(module: Module, call: ast.Call) -> bool:
    """An `action=` argument, or a hint that always starts with "action: "."""
    action = next((k.value for k in call.keywords if k.arg == "action"), None)
    if action is not None and not (isinstance(action, ast.Constant) and action.value is None):
        return True
    hint = _hint(call)
    hints = strings(module, hint) if hint is not None else set()
    return bool(hints) and all(h.startswith("action: ") for h in hints)


@cache
def sites() -> tuple[Site, ...]:
    found = []
    for module in modules():
        for call in ast.walk(module.tree):
            if not isinstance(call, ast.Call) or not call.args:
                continue
            statuses = _maker_statuses(module, call)
            if not statuses:
                continue
            function = _function(module, call)
            found.append(Site(module.name, function.name if function else "<module>",
                              call.lineno, statuses,
                              frozenset(_as_id(s) for s in strings(module, call.args[0])),
                              _names_its_action(module, call)))
    return tuple(found)


def _site_ids(site: Site) -> frozenset[str]:
    return frozenset(UNFOLLOWED.get((site.file, site.function), site.ids))


def test_the_scan_finds_the_known_shapes_of_finding_calls() -> None:
    """The scan itself: literal, f-string, local, parameter and class-constant ids."""
    ids = {i for s in sites() for i in s.ids}
    assert {"gpu.remapped_rows.pending", "consistency.*", "comm.*.correct", "*.interrupted",
            "stress.membw.peers", "comm.nodes.slow_node", "python.torchvision_ops",
            "gpu.query", "gpu.fabric", "ranks.numa", "torch.probe"} <= ids
    kernel = [s for s in sites() if "kernel_log.xid" in s.ids]
    assert kernel and all(s.explicit and s.statuses == ("FAIL", "WARN") for s in kernel)


def test_every_warn_and_fail_check_id_in_the_source_has_an_action_rule() -> None:
    missing = sorted(f"{site.where}: {check} {status}" for site in sites()
                     if not site.explicit for check in _site_ids(site)
                     for status in site.statuses if rule_for(check, status) is None)
    assert not missing, ("WARN/FAIL check ids without a rule in gpucheck/actions.py RULES "
                         "(or, where the scan cannot see the id, UNFOLLOWED here):\n"
                         + "\n".join(missing))


def test_every_rule_is_used_by_some_check_id_in_the_source() -> None:
    """A rule no id reaches is a renamed or removed check: update the table."""
    ids = {(i, s) for site in sites() for i in _site_ids(site) for s in site.statuses}
    unused = [r.pattern for r in RULES if not any(
        r.matches(i, s, r.keyword.lower() if r.keyword else "") for i, s in ids)]
    assert not unused


@pytest.mark.parametrize(("place", "ids"), list(UNFOLLOWED.items()))
def test_unfollowed_sites_still_exist_and_still_make_their_ids(
        place: tuple[str, str], ids: tuple[str, ...]) -> None:
    file, _function_name = place
    here = [s for s in sites() if (s.file, s.function) == place]
    assert here and all(UNKNOWN in i for s in here for i in s.ids), \
        f"the scan follows {place} now: drop it from UNFOLLOWED"
    source = (PACKAGE / file).read_text()
    assert all(i.rsplit(".", 1)[-1] in source for i in ids)


def test_no_two_rules_tie_for_one_id_with_different_actions() -> None:
    """Equally specific rules for one id must agree (each keyword tried on its own)."""
    ids = {(i, s) for site in sites() for i in _site_ids(site) for s in site.statuses}
    texts = ["", *{r.keyword.lower() for r in RULES if r.keyword}]
    ties = []
    for (check, status), text in itertools.product(sorted(ids), texts):
        matching = [r for r in RULES if r.matches(check, status, text)]
        top = max((r.specificity for r in matching), default=None)
        actions = {r.action.value for r in matching if r.specificity == top}
        if len(actions) > 1:
            ties.append(f"{check} {status} {text!r}: {sorted(actions)}")
    assert not ties
