"""The check registry (gpucheck.checks): every check id a finding site can make is
declared, every declaration is filled in and used, and actions follow from data.

A static scan, approximate by design, finds the finding sites: `warn`, `fail`, `ok`,
`skip` and `Finding(..)` calls, following their first argument through string literals,
f-strings (a formatted part it cannot see becomes a `*` segment), local and module
assignments, class constants and, for a function parameter, the calls of that function
elsewhere in the package. What it cannot follow is listed in UNFOLLOWED, with the ids
the site makes, and checked for drift.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import gpucheck
from gpucheck import subject
from gpucheck.actions import Action, Status
from gpucheck.checks import CHECKS, lookup
from gpucheck.measure import Better, Bound, LookState, Metric, SecondLook
from gpucheck.report import Finding, Report, Section, fail, looked, ok, warn

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
        if path == PACKAGE / "report.py" or PACKAGE / "checks" in path.parents:
            continue  # the makers themselves, and the declarations
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
    names = {"warn": ("WARN",), "fail": ("FAIL",), "ok": ("OK",), "skip": ("SKIP",)}
    callee = _callee(call)
    if callee in names:
        return names[callee]
    if callee == "Finding" and len(call.args) > 1 and isinstance(call.args[1], ast.Attribute) \
            and call.args[1].attr in ("WARN", "FAIL", "OK", "SKIP"):
        return (call.args[1].attr,)
    function = _function(module, call)
    if isinstance(call.func, ast.Name) and function is not None:
        bound = [v for v in _assigned(function, call.func.id) if v is not None]
        aliases = {n.id for v in bound for n in ast.walk(v) if isinstance(n, ast.Name)}
        if bound and aliases & set(names):
            return tuple(s for alias in sorted(aliases & set(names)) for s in names[alias])
    return ()


def _names_its_action(module: Module, call: ast.Call) -> bool:
    """A `cause=` or `relayed=` argument: data the action follows from at the site."""
    given = [k.value for k in call.keywords if k.arg in ("cause", "relayed")]
    return any(not (isinstance(v, ast.Constant) and v.value is None) for v in given)


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


def _concrete(check_id: str) -> str:
    """A scanned id with `*` segments as one the templates must match."""
    return ".".join("x" if s == UNKNOWN else s for s in check_id.split("."))


def test_the_scan_finds_the_known_shapes_of_finding_calls() -> None:
    """The scan itself: literal, f-string, local, parameter and class-constant ids."""
    ids = {i for s in sites() for i in s.ids}
    assert {"gpu.remapped_rows.pending", "consistency.*", "comm.*.correct", "*.interrupted",
            "stress.membw.peers", "comm.nodes.slow_node", "python.torchvision_ops",
            "gpu.query", "gpu.fabric", "ranks.numa", "torch.probe", "gpu.numa"} <= ids
    kernel = [s for s in sites() if "kernel_log.xid" in s.ids and "FAIL" in s.statuses]
    assert kernel and all(s.explicit for s in kernel)


def test_every_check_id_in_the_source_is_declared() -> None:
    missing = []
    for site in sites():
        for check in _site_ids(site):
            if check == UNKNOWN:  # an id the scan cannot see at all (relayed, tabled)
                continue
            try:
                lookup(_concrete(check))
            except KeyError as error:
                missing.append(f"{site.where}: {check}: {error}")
    assert not missing, "\n".join(missing)


def test_every_warn_and_fail_of_the_source_has_a_declared_action() -> None:
    """A site that names no action needs its status in the check's action_by_status."""
    missing = sorted(f"{site.where}: {check} {status}" for site in sites()
                     if not site.explicit for check in _site_ids(site) if check != UNKNOWN
                     for status in site.statuses if status in ("WARN", "FAIL")
                     and Status(status) not in lookup(_concrete(check)).action_by_status)
    assert not missing, "\n".join(missing)


def _literal_tail(check_id: str) -> str:
    return next(s for s in reversed(check_id.split(".")) if not s.startswith("{"))


def test_every_declared_check_is_made_somewhere_in_the_source() -> None:
    """A declaration no code makes is a renamed or removed check: drop it."""
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py")
                       if PACKAGE / "checks" not in p.parents)
    unused = [c for c in CHECKS if _literal_tail(c) not in source]
    assert not unused


@pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))
def test_every_declaration_is_filled_in_and_its_docs_file_exists(check: object) -> None:
    from gpucheck.checks import Check
    assert isinstance(check, Check)
    assert check.title and check.measures and len(check.why) > 20
    docs, _, anchor = check.docs_anchor.partition("#")
    assert anchor and (PACKAGE.parent / docs).is_file(), check.docs_anchor
    assert all(len(c.why) > 20 and c.key for c in check.causes)
    assert set(check.action_by_status) <= {Status.WARN, Status.FAIL}


@pytest.mark.parametrize(("place", "ids"), list(UNFOLLOWED.items()))
def test_unfollowed_sites_still_exist_and_still_make_their_ids(
        place: tuple[str, str], ids: tuple[str, ...]) -> None:
    file, _function_name = place
    here = [s for s in sites() if (s.file, s.function) == place]
    assert here and all(UNKNOWN in i for s in here for i in s.ids), \
        f"the scan follows {place} now: drop it from UNFOLLOWED"
    source = (PACKAGE / file).read_text()
    assert all(i.rsplit(".", 1)[-1] in source for i in ids)


# Every rule of the old keyword table (gpucheck/actions.py RULES before issue 25), and
# every declared id with no words, with the action the old table gave: the move to the
# registry changes no action. (check, status, words in the message, action before.)
OLD_ACTIONS: list[tuple[str, str, str, str]] = [
    ('env.probe', 'WARN', '', 'rerun'),
    ('env.probe', 'FAIL', '', 'rerun'),
    ('env.interrupted', 'WARN', '', 'rerun'),
    ('env.interrupted', 'FAIL', '', 'rerun'),
    ('env.failed', 'WARN', '', 'rerun'),
    ('env.failed', 'FAIL', '', 'rerun'),
    ('all.env.failed', 'WARN', '', 'rerun'),
    ('all.env.failed', 'FAIL', '', 'rerun'),
    ('env.rank_failed', 'WARN', '', 'rerun'),
    ('env.rank_failed', 'FAIL', '', 'rerun'),
    ('env.rank_unresponsive', 'WARN', '', 'rerun'),
    ('env.rank_unresponsive', 'FAIL', '', 'rerun'),
    ('env.checkin', 'WARN', '', 'fix-config'),
    ('env.checkin', 'FAIL', '', 'fix-config'),
    ('driver.nvml', 'WARN', '', 'fix-config'),
    ('driver.nvml', 'FAIL', '', 'fix-config'),
    ('driver.nvml', 'FAIL', 'is lost', 'drain-node'),
    ('driver.nvml', 'FAIL', 'needs a reset', 'reset-gpu'),
    ('driver.nvml', 'FAIL', 'timed out', 'reset-gpu'),
    ('driver.nvml', 'FAIL', 'no answer', 'reset-gpu'),
    ('driver.nvml_slow', 'WARN', '', 'none'),
    ('driver.nvml_slow', 'FAIL', '', 'none'),
    ('driver.nvml_hang', 'WARN', '', 'drain-node'),
    ('driver.nvml_hang', 'FAIL', '', 'drain-node'),
    ('driver.cuda_compat', 'WARN', '', 'fix-config'),
    ('driver.cuda_compat', 'FAIL', '', 'fix-config'),
    ('gpu.lost', 'WARN', '', 'drain-node'),
    ('gpu.lost', 'FAIL', '', 'drain-node'),
    ('gpu.query', 'WARN', '', 'reset-gpu'),
    ('gpu.query', 'FAIL', '', 'reset-gpu'),
    ('gpu.query', 'WARN', 'not permitted', 'fix-config'),
    ('gpu.query', 'FAIL', 'not permitted', 'fix-config'),
    ('gpu.busy', 'WARN', '', 'rerun'),
    ('gpu.busy', 'FAIL', '', 'rerun'),
    ('gpu.pcie.width', 'WARN', '', 'replace-hardware'),
    ('gpu.pcie.width', 'FAIL', '', 'replace-hardware'),
    ('gpu.ecc.volatile_uncorrected', 'WARN', '', 'drain-node'),
    ('gpu.ecc.volatile_uncorrected', 'FAIL', '', 'drain-node'),
    ('gpu.ecc.aggregate_uncorrected', 'WARN', '', 'none'),
    ('gpu.ecc.aggregate_uncorrected', 'FAIL', '', 'none'),
    ('gpu.retired_pages.pending', 'WARN', '', 'reset-gpu'),
    ('gpu.retired_pages.pending', 'FAIL', '', 'reset-gpu'),
    ('gpu.remapped_rows.pending', 'WARN', '', 'reset-gpu'),
    ('gpu.remapped_rows.pending', 'FAIL', '', 'reset-gpu'),
    ('gpu.bank_remap.pending', 'WARN', '', 'reset-gpu'),
    ('gpu.bank_remap.pending', 'FAIL', '', 'reset-gpu'),
    ('gpu.remapped_rows.failed', 'WARN', '', 'replace-hardware'),
    ('gpu.remapped_rows.failed', 'FAIL', '', 'replace-hardware'),
    ('gpu.clocks.event_reasons', 'WARN', '', 'drain-node'),
    ('gpu.clocks.event_reasons', 'FAIL', '', 'drain-node'),
    ('gpu.persistence_mode', 'WARN', '', 'fix-config'),
    ('gpu.persistence_mode', 'FAIL', '', 'fix-config'),
    ('gpu.mig_mode', 'WARN', '', 'reset-gpu'),
    ('gpu.mig_mode', 'FAIL', '', 'reset-gpu'),
    ('gpu.fabric', 'WARN', '', 'fix-config'),
    ('gpu.fabric', 'FAIL', '', 'fix-config'),
    ('gpu.fabric', 'WARN', 'still in progress', 'rerun'),
    ('gpu.fabric', 'FAIL', 'still in progress', 'rerun'),
    ('gpu.fabric.health', 'WARN', '', 'drain-node'),
    ('gpu.fabric.health', 'FAIL', '', 'drain-node'),
    ('gpu.fabric.degraded_bandwidth', 'WARN', '', 'drain-node'),
    ('gpu.fabric.degraded_bandwidth', 'FAIL', '', 'drain-node'),
    ('gpu.fabric.route_unhealthy', 'WARN', '', 'drain-node'),
    ('gpu.fabric.route_unhealthy', 'FAIL', '', 'drain-node'),
    ('gpu.fabric.recovering', 'WARN', '', 'rerun'),
    ('gpu.fabric.recovering', 'FAIL', '', 'rerun'),
    ('gpu.fabric.configuration', 'WARN', '', 'fix-config'),
    ('gpu.fabric.configuration', 'FAIL', '', 'fix-config'),
    ('gpu.fabric.configuration', 'WARN', 'INSUFFICIENT_NVLINKS', 'drain-node'),
    ('gpu.fabric.configuration', 'FAIL', 'INSUFFICIENT_NVLINKS', 'drain-node'),
    ('gpu.recovery_action', 'WARN', '', 'drain-node'),
    ('gpu.recovery_action', 'FAIL', '', 'drain-node'),
    ('gpu.recovery_action', 'WARN', 'RECOVERY_ACTION_GPU_RESET', 'reset-gpu'),
    ('gpu.recovery_action', 'FAIL', 'RECOVERY_ACTION_GPU_RESET', 'reset-gpu'),
    ('gpu.recovery_action', 'WARN', 'RECOVERY_ACTION_BUS_RESET', 'reset-gpu'),
    ('gpu.recovery_action', 'FAIL', 'RECOVERY_ACTION_BUS_RESET', 'reset-gpu'),
    ('gpu.topology', 'WARN', '', 'rerun'),
    ('gpu.topology', 'FAIL', '', 'rerun'),
    ('gpu.topology', 'WARN', 'no answer', 'reset-gpu'),
    ('gpu.topology', 'FAIL', 'no answer', 'reset-gpu'),
    ('gpu.topology', 'WARN', 'timed out', 'reset-gpu'),
    ('gpu.topology', 'FAIL', 'timed out', 'reset-gpu'),
    ('gpu.arch_supported', 'WARN', '', 'fix-config'),
    ('gpu.arch_supported', 'FAIL', '', 'fix-config'),
    ('gpu.functional', 'WARN', '', 'drain-node'),
    ('gpu.functional', 'FAIL', '', 'drain-node'),
    ('gpu.count', 'FAIL', '', 'drain-node'),
    ('gpu.count', 'WARN', '', 'fix-config'),
    ('ib.ports', 'WARN', '', 'drain-node'),
    ('ib.ports', 'FAIL', '', 'drain-node'),
    ('ib.port.state', 'FAIL', '', 'drain-node'),
    ('ib.port.state', 'WARN', '', 'fix-config'),
    ('ib.port.rate', 'WARN', '', 'replace-hardware'),
    ('ib.port.rate', 'FAIL', '', 'replace-hardware'),
    ('ib.port.link_downed', 'WARN', '', 'drain-node'),
    ('ib.port.link_downed', 'FAIL', '', 'drain-node'),
    ('health.state', 'WARN', '', 'fix-config'),
    ('health.state', 'FAIL', '', 'drain-node'),  # not known to be healthy (issue 34)
    ('system.shm', 'WARN', '', 'fix-config'),
    ('system.shm', 'FAIL', '', 'fix-config'),
    ('torch.build', 'WARN', '', 'fix-config'),
    ('torch.build', 'FAIL', '', 'fix-config'),
    ('python.torch_location', 'WARN', '', 'fix-config'),
    ('python.torch_location', 'FAIL', '', 'fix-config'),
    ('python.deprecated.x', 'WARN', '', 'fix-config'),
    ('python.deprecated.x', 'FAIL', '', 'fix-config'),
    ('consistency.cuda_visible_devices', 'WARN', '', 'fix-config'),
    ('consistency.cuda_visible_devices', 'FAIL', '', 'fix-config'),
    ('env.nodes.differ', 'WARN', '', 'fix-config'),
    ('env.nodes.differ', 'FAIL', '', 'fix-config'),
    ('ranks.numa', 'WARN', '', 'fix-config'),
    ('ranks.numa', 'FAIL', '', 'fix-config'),
    ('launch.cpu_ranks', 'WARN', '', 'fix-config'),
    ('launch.cpu_ranks', 'FAIL', '', 'fix-config'),
    ('bench.images.skipped', 'WARN', '', 'fix-config'),
    ('bench.images.skipped', 'FAIL', '', 'fix-config'),
    ('bench.rank.straggler', 'WARN', '', 'rerun'),
    ('bench.rank.straggler', 'FAIL', '', 'rerun'),
    ('bench.rank.straggler', 'WARN', 'its host did not run it', 'fix-config'),
    ('bench.rank.straggler', 'FAIL', 'its host did not run it', 'fix-config'),
    ('bench.node.slow', 'WARN', '', 'rerun'),
    ('bench.node.slow', 'FAIL', '', 'rerun'),
    ('bench.consistency', 'WARN', '', 'rerun'),
    ('bench.consistency', 'FAIL', '', 'drain-node'),
    ('bench.consistency', 'WARN', 'suspect the software', 'fix-config'),
    ('bench.consistency', 'FAIL', 'suspect the software', 'fix-config'),
    ('comm.all_reduce.correct', 'WARN', '', 'drain-node'),
    ('comm.all_reduce.correct', 'FAIL', '', 'drain-node'),
    ('comm.all_reduce.busbw_baseline', 'WARN', '', 'rerun'),
    ('comm.all_reduce.busbw_baseline', 'FAIL', '', 'rerun'),
    ('comm.pairwise.slow_pair', 'WARN', '', 'rerun'),
    ('comm.pairwise.slow_pair', 'FAIL', '', 'rerun'),
    ('comm.nodes.slow_node', 'WARN', '', 'rerun'),
    ('comm.nodes.slow_node', 'FAIL', '', 'rerun'),
    ('comm.internode.slow_pair', 'WARN', '', 'rerun'),
    ('comm.internode.slow_pair', 'FAIL', '', 'rerun'),
    ('comm.internode.slow_rail', 'WARN', '', 'rerun'),
    ('comm.internode.slow_rail', 'FAIL', '', 'rerun'),
    ('comm.internode.shared_node', 'WARN', '', 'rerun'),
    ('comm.internode.shared_node', 'FAIL', '', 'rerun'),
    ('comm.pairwise.slow_pair', 'WARN', 'cpu ranks exchange', 'rerun'),
    ('comm.pairwise.slow_pair', 'WARN', 'confirmed:', 'drain-node'),
    ('comm.pairwise.slow_pair', 'FAIL', 'confirmed:', 'drain-node'),
    ('comm.nodes.slow_node', 'WARN', 'confirmed:', 'drain-node'),
    ('comm.nodes.slow_node', 'FAIL', 'confirmed:', 'drain-node'),
    ('comm.internode.slow_pair', 'WARN', 'confirmed:', 'drain-node'),
    ('comm.internode.slow_pair', 'FAIL', 'confirmed:', 'drain-node'),
    ('comm.internode.slow_rail', 'WARN', 'confirmed:', 'drain-node'),
    ('comm.internode.slow_rail', 'FAIL', 'confirmed:', 'drain-node'),
    ('comm.internode.shared_node', 'WARN', 'confirmed:', 'drain-node'),
    ('comm.internode.shared_node', 'FAIL', 'confirmed:', 'drain-node'),
    ('comm.transport.bad_interface', 'WARN', '', 'fix-config'),
    ('comm.transport.bad_interface', 'FAIL', '', 'fix-config'),
    ('stress.gemm.peers', 'WARN', '', 'drain-node'),
    ('stress.gemm.peers', 'FAIL', '', 'drain-node'),
    ('stress.sdc.straggler', 'WARN', '', 'drain-node'),
    ('stress.sdc.straggler', 'FAIL', '', 'drain-node'),
    ('stress.copies.together', 'WARN', '', 'rerun'),
    ('stress.copies.together', 'FAIL', '', 'rerun'),
    ('stress.gemm.expected', 'WARN', '', 'fix-config'),
    ('stress.gemm.expected', 'FAIL', '', 'fix-config'),
    ('stress.copies.link', 'WARN', '', 'drain-node'),
    ('stress.copies.link', 'FAIL', '', 'drain-node'),
    ('stress.sdc.repeat', 'WARN', '', 'drain-node'),
    ('stress.sdc.repeat', 'FAIL', '', 'drain-node'),
    ('stress.sdc.agreement', 'WARN', '', 'rerun'),
    ('stress.sdc.agreement', 'FAIL', '', 'drain-node'),
    ('stress.sdc.agreement', 'WARN', 'suspect the software', 'fix-config'),
    ('stress.sdc.agreement', 'FAIL', 'suspect the software', 'fix-config'),
    ('stress.sdc.software_split', 'WARN', '', 'fix-config'),
    ('stress.sdc.software_split', 'FAIL', '', 'fix-config'),
    ('stress.p2p', 'WARN', '', 'drain-node'),
    ('stress.p2p', 'FAIL', '', 'drain-node'),
    ('stress.p2p', 'WARN', 'without peer access', 'fix-config'),
    ('stress.p2p', 'FAIL', 'without peer access', 'fix-config'),
    ('stress.power.reach', 'WARN', '', 'rerun'),
    ('stress.power.reach', 'FAIL', '', 'rerun'),
    ('stress.power.limit', 'WARN', '', 'fix-config'),
    ('stress.power.limit', 'FAIL', '', 'fix-config'),
    ('stress.numa', 'WARN', '', 'fix-config'),
    ('stress.numa', 'FAIL', '', 'fix-config'),
    ('stress.gemm.peers', 'WARN', 'not measured again', 'rerun'),
    ('stress.gemm.peers', 'FAIL', 'not measured again', 'rerun'),
    ('stress.sdc.straggler', 'WARN', 'not measured again', 'rerun'),
    ('stress.sdc.straggler', 'FAIL', 'not measured again', 'rerun'),
    ('stress.copies.together', 'WARN', 'not measured again', 'rerun'),
    ('stress.copies.together', 'FAIL', 'not measured again', 'rerun'),
    ('stress.copies.link', 'WARN', 'not measured again', 'rerun'),
    ('stress.copies.link', 'FAIL', 'not measured again', 'rerun'),
    ('stress.p2p', 'WARN', 'not measured again', 'rerun'),
    ('stress.p2p', 'FAIL', 'not measured again', 'rerun'),
    ('hang.rank.d_state', 'WARN', '', 'drain-node'),
    ('hang.rank.d_state', 'FAIL', '', 'drain-node'),
    ('hang.rank.unreadable', 'WARN', '', 'fix-config'),
    ('hang.rank.unreadable', 'FAIL', '', 'fix-config'),
    ('hang.verdict', 'WARN', '', 'rerun'),
    ('hang.verdict', 'FAIL', '', 'rerun'),
    ('hang.traces.agree', 'WARN', '', 'restart-app'),
    ('hang.traces.agree', 'FAIL', '', 'restart-app'),
    ('consistency.gpu_count', 'WARN', '', 'fix-config'),
    ('consistency.gpu_count', 'FAIL', '', 'fix-config'),
    ('consistency.x', 'WARN', '', 'fix-config'),
    ('consistency.x', 'FAIL', '', 'fix-config'),
    ('python.torchvision_ops', 'WARN', '', 'fix-config'),
    ('python.torchvision_ops', 'FAIL', '', 'fix-config'),
    ('torch.cuda_available', 'WARN', '', 'fix-config'),
    ('torch.cuda_available', 'FAIL', '', 'fix-config'),
    ('torch.cudnn', 'WARN', '', 'fix-config'),
    ('torch.cudnn', 'FAIL', '', 'fix-config'),
    ('torch.import', 'WARN', '', 'fix-config'),
    ('torch.import', 'FAIL', '', 'fix-config'),
    ('torch.nccl', 'WARN', '', 'fix-config'),
    ('torch.nccl', 'FAIL', '', 'fix-config'),
    ('comm.transport.sockets_with_ib', 'WARN', '', 'fix-config'),
    ('comm.transport.sockets_with_ib', 'FAIL', '', 'fix-config'),
    ('stress.membw.expected', 'WARN', '', 'fix-config'),
    ('stress.membw.expected', 'FAIL', '', 'fix-config'),
    ('stress.membw.peers', 'WARN', '', 'drain-node'),
    ('stress.membw.peers', 'FAIL', '', 'drain-node'),
    ('hang.rank.dead', 'WARN', '', 'restart-app'),
    ('hang.rank.dead', 'FAIL', '', 'restart-app'),
    ('hang.traces.armed', 'WARN', '', 'restart-app'),
    ('hang.traces.armed', 'FAIL', '', 'restart-app'),
    ('hang.traces.desync', 'WARN', '', 'restart-app'),
    ('hang.traces.desync', 'FAIL', '', 'restart-app'),
    ('hang.traces.missing', 'WARN', '', 'restart-app'),
    ('hang.traces.missing', 'FAIL', '', 'restart-app'),
    ('hang.traces.no_dump', 'WARN', '', 'restart-app'),
    ('hang.traces.no_dump', 'FAIL', '', 'restart-app'),
    ('hang.traces.split', 'WARN', '', 'restart-app'),
    ('hang.traces.split', 'FAIL', '', 'restart-app'),
    ('hang.traces.x', 'WARN', '', 'restart-app'),
    ('hang.traces.x', 'FAIL', '', 'restart-app'),
    # Words of two rules at once: the more specific rule won (a status, then order).
    ("comm.pairwise.slow_pair", "WARN", "cpu ranks exchange; confirmed: twice", "rerun"),
    ("comm.pairwise.slow_pair", "FAIL", "cpu ranks exchange; confirmed: twice", "drain-node"),
    ("stress.p2p", "WARN", "without peer access; not measured again", "fix-config"),
    ("driver.nvml", "WARN", "the GPU is lost", "fix-config"),  # the keyword was FAIL-only
    ("stress.sdc.agreement", "FAIL", "suspect the SOFTWARE", "fix-config"),
]


# The old keyword table's words, each as the data its finding's site now sets: (check
# pattern, words, cause, look state, the only status the words counted for).
_F, _W = Status.FAIL, Status.WARN
OLD_WORDS: tuple[tuple[str, str, str | None, LookState | None, Status | None], ...] = (
    ("driver.nvml", "is lost", "gpu_lost", None, _F),
    ("driver.nvml", "needs a reset", "needs_reset", None, _F),
    ("driver.nvml", "timed out", "timed_out", None, _F),
    ("driver.nvml", "no answer", "no_answer", None, _F),
    ("gpu.query", "not permitted", "no_permission", None, None),
    ("gpu.fabric", "still in progress", "registering", None, None),
    ("gpu.fabric.configuration", "INSUFFICIENT_NVLINKS", "insufficient_nvlinks", None, None),
    ("gpu.recovery_action", "RECOVERY_ACTION_GPU_RESET", "gpu_reset", None, None),
    ("gpu.recovery_action", "RECOVERY_ACTION_BUS_RESET", "bus_reset", None, None),
    ("gpu.topology", "no answer", "no_answer", None, None),
    ("gpu.topology", "timed out", "timed_out", None, None),
    ("bench.rank.straggler", "its host did not run it", "host_stall", None, None),
    ("bench.consistency", "suspect the software", "all_alike", None, None),
    ("stress.sdc.agreement", "suspect the software", "all_alike", None, None),
    ("stress.p2p", "without peer access", "no_peer_access", None, None),
    ("comm.pairwise.slow_pair", "cpu ranks exchange", "cpu_ranks", None, _W),
    *((c, "confirmed:", None, LookState.CONFIRMED, None) for c in (
        "comm.pairwise.slow_pair", "comm.nodes.slow_node", "comm.internode.slow_pair",
        "comm.internode.slow_rail", "comm.internode.shared_node")),
    *((c, "not measured again", None, LookState.NOT_MEASURED, None) for c in (
        "stress.*.peers", "stress.sdc.straggler", "stress.copies.together",
        "stress.copies.link", "stress.p2p")),
)


def _as_data(check: str, status: Status, words: str) -> tuple[str | None, LookState | None]:
    """The cause and look state a site sets where the old table read `words`."""
    cause = look = None
    for pattern, said, key, state, only in OLD_WORDS:
        fits = len(pattern.split(".")) == len(check.split(".")) and all(
            w in ("*", p) for w, p in zip(pattern.split("."), check.split("."), strict=True))
        if fits and only in (None, status) and said.lower() in words.lower():
            cause, look = key or cause, state or look
    return cause, look


@pytest.mark.parametrize(("check", "status", "words", "action"), OLD_ACTIONS)
def test_every_old_rule_gives_the_same_action(check: str, status: str, words: str,
                                              action: str) -> None:
    """The same action from the data the sites set; the words themselves count for
    nothing (the message below is the old words, and the plain one gives the same)."""
    cause, state = _as_data(check, Status(status), words)
    look = _look(state) if state is not None else None
    made = Finding(check, Status(status), words or "seen", "look", cause=cause, look=look)
    plain = Finding(check, Status(status), "seen", "look", cause=cause, look=look)
    assert made.action == plain.action == action


def _look(state: LookState) -> SecondLook:
    again = None if state is LookState.NOT_MEASURED else 41.0
    return SecondLook(40.0, again, 80.0, (subject.pair(2, 5),), "GB/s",
                      Bound.fraction(0.7, Better.HIGHER), state,
                      why_not="the run ended first" if again is None else None)


WORDS = ("confirmed: measured again", "not measured again", "action: drain-node: drain it",
         "cpu ranks exchange", "suspect the software", "its host did not run it")


@pytest.mark.parametrize("words", WORDS)
@pytest.mark.parametrize("state", [LookState.CONFIRMED, LookState.NOT_MEASURED])
def test_action_ignores_message_words(words: str, state: LookState) -> None:
    """Once a cause or a look is set, no word of the message or hint counts."""
    for check in ("comm.pairwise.slow_pair", "stress.gemm.peers", "comm.nodes.slow_node"):
        plain = warn(check, "slow", "h", subject.rank(3), look=_look(state))
        worded = warn(check, f"slow; {words}", f"{words} (hint)", subject.rank(3),
                      look=_look(state))
        assert worded.action == plain.action == lookup(check).action(Status.WARN,
                                                                      look=_look(state))
    caused = warn("comm.pairwise.slow_pair", words, words, cause="cpu_ranks")
    assert caused.action == Action.RERUN
    straggler = warn("bench.rank.straggler", words, f"action: drain-node: {words}",
                     cause="host_stall")
    assert straggler.action == Action.FIX_CONFIG


ACTING = (LookState.CONFIRMED, LookState.NOT_MEASURED)


def test_the_looks_decide_as_the_old_words_did() -> None:
    """Confirmed drains, not measured again reruns (comm and stress peers); contended
    copies never drain; below-expected stays a setting."""
    for check in ("comm.internode.slow_rail", "stress.membw.peers", "stress.p2p"):
        assert [warn(check, "m", "h", look=_look(s)).action for s in ACTING] == [
            "drain-node", "rerun"]
    assert {warn("stress.copies.together", "m", "h", look=_look(s)).action
            for s in ACTING} == {"rerun"}
    assert [warn("stress.gemm.expected", "m", "h", look=_look(s)).action
            for s in ACTING] == ["fix-config", "fix-config"]


@pytest.mark.parametrize("check", ["comm.pairwise.slow_pair", "comm.internode.slow_pair",
                                   "comm.nodes.slow_node", "stress.gemm.peers", "stress.p2p",
                                   "stress.gemm.expected", "bench.rank.straggler",
                                   "preflight.node_all_reduce"])
def test_a_look_that_cleared_the_figure_is_an_ok_keeping_it(check: str) -> None:
    """Issue 36 item 4: unstable ("act only if it repeats") is no WARN for any check with
    a second look; `looked` is the one place that decides, and a WARN built by hand with
    an unstable look is refused."""
    unstable, confirmed = _look(LookState.UNSTABLE), _look(LookState.CONFIRMED)
    cleared = looked(check, "m", "h", subject.rank(3), unstable)
    assert (cleared.status, cleared.action, cleared.look) == (Status.OK, None, unstable)
    named = looked(check, "m", "h", subject.rank(3), confirmed)
    assert named.status is Status.WARN and named.action is not None
    with pytest.raises(ValueError, match="asks nothing"):
        warn(check, "m", "h", look=unstable)


def test_a_cause_outranks_the_look_and_must_be_declared() -> None:
    confirmed = _look(LookState.CONFIRMED)
    assert warn("comm.nodes.slow_node", "m", "h", look=confirmed, cause="cpu_ranks").action \
        == "rerun"
    with pytest.raises(ValueError, match="unknown cause"):
        warn("comm.nodes.slow_node", "m", "h", cause="gremlins")
    with pytest.raises(ValueError, match="without on_look"):
        warn("gpu.busy", "m", "h", look=confirmed)
    assert fail("driver.nvml", "m", "h", cause="gpu_lost").action == "drain-node"
    with pytest.raises(ValueError, match="is a FAIL"):
        warn("driver.nvml", "m", "h", cause="gpu_lost")


def test_relaying_checks_take_the_action_of_the_finding_they_relay() -> None:
    assert fail("fleet.node", "m", "h", relayed="reset-gpu").action == "reset-gpu"
    assert warn("compare.findings", "m", "h", relayed=Action.NONE).action == "none"


def test_an_undeclared_id_fails() -> None:
    with pytest.raises(KeyError, match="not declared"):
        warn("gpu.brand_new", "m", "h")


def test_schema_3_round_trips_cause_look_and_subject_as_data() -> None:
    gpu = subject.gpu(5, "GPU 5 (H200, bus 0000:17:00.0)", bus_id="0000:17:00.0")
    findings = [warn("comm.pairwise.slow_pair", "41 GB/s", "h", subject.pair(2, 5),
                     look=_look(LookState.CONFIRMED)),
                warn("comm.nodes.slow_node", "slow", "h", subject.node(1, host="n1"),
                     look=_look(LookState.NOT_MEASURED), cause="cpu_ranks"),
                fail("driver.nvml", "lost", "h", gpu, cause="gpu_lost"),
                ok("gpu.numa", "fine", subject.text("NUMA node 0"))]
    busbw = Metric("comm.all_reduce.busbw_gbps@1048576", "GB/s", Better.HIGHER, 80.5,
                   subject.pair(2, 5), spread=0.03)
    report = Report("comm", [Section("s", "S", findings=findings, metrics=[busbw])])
    raw = json.loads(json.dumps(report.to_dict()))
    assert raw["sections"][0]["metrics"][0]["subject"]["peer"] == 5
    assert raw["schema_version"] == 3
    stored = raw["sections"][0]["findings"]
    assert stored[0]["look"]["state"] == "confirmed" and stored[0]["action"] == "drain-node"
    assert stored[0]["subject"] == "rank 2 -> rank 5"
    assert stored[0]["subject_fields"] == {"kind": "pair", "label": "rank 2 -> rank 5",
                                           "rank": 2, "peer": 5}
    assert stored[1]["cause"] == "cpu_ranks" and stored[2]["subject_fields"]["gpu"] == 5
    assert stored[3]["subject"] == "NUMA node 0" and stored[3]["subject_fields"] is None
    again = Report.from_dict(raw)
    assert again.to_dict() == report.to_dict()
    assert again.findings == report.findings
    assert again.findings[2].subject.bus_id == "0000:17:00.0"  # type: ignore[union-attr]


def test_no_hint_of_the_source_starts_with_an_action() -> None:
    """The "action: <x>: " prefix is gone: the XID and fault tables give causes."""
    prefixed = {m.name for m in modules()
                if re.search(r"f?\"action: \{", ast.unparse(m.tree))}
    assert prefixed == set()


def _reads_words(tree: ast.AST) -> list[str]:
    """String matching in a module: `x in <message|hint|text|words>`, `.startswith` /
    `.endswith` / `.lower` / `.split` on such a name, and any `re` use."""
    found = []
    wordy = re.compile(r"message|hint|text|words")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [f"imports {n}" for n in names if n == "re"]
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                  for o in node.ops):
            found += [ast.unparse(node) for c in node.comparators
                      if wordy.search(ast.unparse(c))]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith", "lower", "split", "find") and \
                wordy.search(ast.unparse(node.func.value)):
            found.append(ast.unparse(node))
    return found


def test_actions_and_checks_hold_no_string_matching_on_messages_or_hints() -> None:
    """No decision reads a message: actions.py and checks/ match no words (issue 25)."""
    files = [PACKAGE / "actions.py", *sorted((PACKAGE / "checks").glob("*.py"))]
    assert not (PACKAGE / "checks" / "legacy.py").exists()
    for path in files:
        assert _reads_words(ast.parse(path.read_text())) == [], path


def test_the_word_scan_sees_what_the_old_table_did() -> None:
    old = ast.parse("import re\n"
                    "def f(message, hint):\n"
                    "    return 'is lost' in message or hint.startswith('action: ')\n")
    assert len(_reads_words(old)) == 3


@pytest.mark.parametrize(("key", "value"), [
    ("metrics", 3), ("metrics", [{"name": "x", "unit": "s", "better": "up", "value": 1}]),
    ("look", {"state": "confirmed"}), ("subject_fields", {"kind": "rank", "label": 3})])
def test_a_damaged_schema_3_field_is_a_damaged_report(tmp_path: Path, key: str,
                                                      value: object) -> None:
    from gpucheck.analysis.loading import ReportError, load_report
    raw = Report("env", [Section("s", "S", findings=[ok("gpu.numa", "fine")])]).to_dict()
    target = raw["sections"][0] if key == "metrics" else raw["sections"][0]["findings"][0]
    target[key] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ReportError, match="damaged"):
        load_report(str(path))


def test_a_preflight_that_names_no_node_drains_nothing() -> None:
    # A budget too short under --strict, or a no-go with no node named, is not a bad node.
    from gpucheck.actions import Action, Status
    from gpucheck.checks import lookup

    assert lookup("preflight.budget").action(Status.FAIL, None, None) is Action.FIX_CONFIG
    assert lookup("preflight.no_go").action(Status.FAIL, None, None) is Action.RERUN
    assert lookup("preflight.node").action(Status.FAIL, None, None) is Action.DRAIN_NODE
