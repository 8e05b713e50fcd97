"""The check registry (gpucheck.checks): every check id a finding site names is
declared with the actions its site needs, every declaration is filled in and made
somewhere, and actions follow from data (cause, look, relayed), never from words."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpucheck
from gpucheck import subject
from gpucheck.checks import CHECKS, Action, Check, Status, lookup
from gpucheck.measure import Better, Bound, LookState, Metric, SecondLook
from gpucheck.report import Report, Section, fail, looked, ok, skip, warn

PACKAGE = Path(gpucheck.__file__).parent
# The makers, and the statuses whose action the declaration must hold (`looked` takes
# its action from the check's on_look).
MAKERS = {"warn": ("WARN",), "fail": ("FAIL",), "ok": (), "skip": (), "looked": ()}


def _literal(node: ast.expr) -> str | None:
    """A check id written in the call: a string, or an f-string whose formatted parts
    become `*` segments; None where nothing of it is written (a name, `f"{a}.{b}"`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        text = "".join(str(v.value) if isinstance(v, ast.Constant) else "\0" for v in node.values)
        segments = ["*" if "\0" in s else s for s in text.split(".")]
        return None if set(segments) == {"*"} else ".".join(segments)
    return None


def sites() -> Iterator[tuple[str, str, tuple[str, ...], bool]]:
    """(where, check id, statuses, names its action) for each warn/fail/ok/skip/looked
    call of the package with a written check id."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "report.py" or PACKAGE / "checks" in path.parents:
            continue
        for call in ast.walk(ast.parse(path.read_text())):
            name = getattr(call, "func", None)
            name = getattr(name, "id", None) or getattr(name, "attr", None)
            if not isinstance(call, ast.Call) or name not in MAKERS or not call.args:
                continue
            check = _literal(call.args[0])
            if check is not None:
                named = any(k.arg in ("cause", "relayed") and not (
                    isinstance(k.value, ast.Constant) and k.value.value is None)
                    for k in call.keywords)
                yield (f"{path.relative_to(PACKAGE)}:{call.lineno}", check, MAKERS[name],
                       named)


def _declared(check: str) -> Check | None:
    """The declaration a written id resolves to (`*` stands for any value)."""
    try:
        return lookup(check.replace("*", "x"))
    except KeyError:
        return None


def test_every_check_id_written_in_the_source_is_declared_with_its_actions() -> None:
    found = list(sites())
    ids = {check for _, check, _, _ in found}
    assert len(found) > 150 and {"gpu.remapped_rows.pending", "comm.*.correct",
                                 "*.interrupted", "gpu.query"} <= ids  # the scan works
    missing = [f"{where}: {check}" for where, check, _, _ in found if _declared(check) is None]
    assert not missing, "\n".join(missing)
    no_action = [f"{where}: {check} {status}" for where, check, statuses, named in found
                 if not named for status in statuses
                 if Status(status) not in lookup(check.replace("*", "x")).action_by_status]
    assert not no_action, "\n".join(no_action)


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
    assert isinstance(check, Check)
    assert check.title and check.measures and len(check.why) > 20
    docs, _, anchor = check.docs_anchor.partition("#")
    assert anchor and (PACKAGE.parent / docs).is_file(), check.docs_anchor
    assert all(len(c.why) > 20 and c.key for c in check.causes)
    assert set(check.action_by_status) <= {Status.WARN, Status.FAIL}


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
    assert named.status in (Status.WARN, Status.FAIL) and named.action is not None
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
    assert warn("gpu.busy", "m", "h", relayed=Action.DRAIN_NODE).action == "rerun"  # relays not
    assert ok("fleet.node", "m").action is None and skip("gpu.busy", "m").action is None


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
    from gpucheck.checks import Action, Status, lookup

    assert lookup("preflight.budget").action(Status.FAIL, None, None) is Action.FIX_CONFIG
    assert lookup("preflight.no_go").action(Status.FAIL, None, None) is Action.RERUN
    assert lookup("preflight.node").action(Status.FAIL, None, None) is Action.DRAIN_NODE
