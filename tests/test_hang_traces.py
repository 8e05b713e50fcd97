"""The Flight Recorder vote on dumps shaped as torch's reader returns them
(`read_dump`: rank, entries, pg_config): the shapes a real dump has, cases no
3-rank gloo run gives cheaply (a subgroup, an extra collective, a tie, NCCL states)."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import pytest

from gpucheck.hang.findings import group_findings, judge_group, traces_section
from gpucheck.hang.traces import groups
from gpucheck.report import Status


def entry(seq: int, op: str = "all_reduce", size: int = 1000, group: str = "0",
          desc: str = "default_pg", state: str = "scheduled", **extra: Any) -> dict[str, Any]:
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
            "profiling_name": f"nccl:{op}", "input_sizes": [[size]], "input_dtypes": ["Float"],
            "output_sizes": [[size]], "output_dtypes": ["Float"], "state": state,
            "process_group": (group, desc), **extra}


def dump(rank: int, entries: list[dict[str, Any]], ranks: str = "[0, 1, 2, 3]") -> dict[str, Any]:
    return {"rank": rank, "host_name": f"host_rank{rank}", "version": "2.10",
            "entries": entries, "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                    "ranks": ranks}}}


def verdicts(dumps: dict[int, dict[str, Any]]):  # type: ignore[no-untyped-def]
    return [judge_group(g, set(dumps)) for g in groups(dumps)]


def steps(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [entry(s, **kw) for s in range(1, n + 1)]


def test_a_rank_that_issued_an_extra_collective_is_the_one_named() -> None:
    dumps = {r: dump(r, steps(5) + ([entry(6, op="barrier")] if r == 3 else []))
             for r in range(4)}
    (v,) = verdicts(dumps)
    assert v.diverge_seq == 6 and list(v.culprits) == [3]
    assert "which no other rank reached" in v.culprits[3]


def test_a_size_mismatch_in_all_reduce_is_a_desync_but_all_gather_sizes_may_differ() -> None:
    dumps = {r: dump(r, [*steps(2), entry(3, size=999 if r == 1 else 1000)]) for r in range(4)}
    (v,) = verdicts(dumps)
    assert list(v.culprits) == [1] and "[[999]]" in v.culprits[1]
    gathers = {r: dump(r, [entry(1, op="all_gather", size=10 + r)]) for r in range(4)}
    (ok,) = verdicts(gathers)
    assert ok.culprits == {} and [f.status for f in group_findings(ok)] == [Status.OK]


def test_an_even_split_names_no_one_in_any_order() -> None:
    dumps = {0: dump(0, [entry(1)], "[0, 1]"), 1: dump(1, [entry(1, op="broadcast")], "[0, 1]")}
    for order in itertools.permutations(dumps):
        (v,) = verdicts({r: dumps[r] for r in order})
        assert v.culprits == {} and sorted(v.split) == [
            "all_reduce [[1000]] ['Float']", "broadcast [[1000]] ['Float']"]
        assert [f.check for f in group_findings(v)] == ["hang.traces.split"]


def test_two_ranks_where_one_never_arrived_name_the_absent_one() -> None:
    dumps = {0: dump(0, steps(3), "[0, 1]"), 1: dump(1, steps(2), "[0, 1]")}
    (v,) = verdicts(dumps)
    assert list(v.culprits) == [1] and "never reached collective #3" in v.culprits[1]


def test_a_subgroup_is_judged_on_its_own_members() -> None:
    sub = {"name": "1", "desc": "tp", "ranks": "[2, 3]"}
    dumps = {r: dump(r, steps(2) + ([entry(1, group="1", desc="tp", op="all_gather")]
                                    if r == 2 else [])) for r in range(4)}
    for r in (2, 3):
        dumps[r]["pg_config"]["1"] = sub
    default, tp = verdicts(dumps)
    assert default.culprits == {}
    assert (tp.members, list(tp.culprits)) == ([2, 3], [3])


def test_a_member_without_a_dump_is_named_when_the_others_agree() -> None:
    dumps = {r: dump(r, steps(4, state="completed")) for r in (0, 1, 3)}
    (v,) = verdicts(dumps)
    assert v.no_dump == [2] and v.last_completed_by_all == 4
    (finding,) = group_findings(v)
    assert (finding.check, finding.subject.label) == ("hang.traces.no_dump", "rank 2")


def test_a_rank_one_collective_behind_a_silent_member_waits_and_the_silent_one_is_named(
        ) -> None:
    """Rank 1 stopped mid-sweep (seen on gloo under load): rank 2 finished #2 and
    entered #3, rank 0 is still inside #2 waiting for rank 1's data. Rank 0 is not the
    cause; rank 1, with no dump, is."""
    members = "[0, 1, 2]"
    dumps = {0: dump(0, steps(2), members), 2: dump(2, steps(3), members)}
    (v,) = verdicts(dumps)
    assert (v.culprits, v.waiting, v.no_dump) == ({}, {0: 2}, [1])
    (finding,) = group_findings(v)
    assert (finding.check, finding.subject.label) == ("hang.traces.no_dump", "rank 1")


def test_survivors_last_collective_completed_after_an_abort_names_only_the_silent_rank(
        ) -> None:
    """After an abort NCCL's aborted kernels read as completed: rank 0's #2
    "completed" is no evidence it went elsewhere. Rank 1 left no dump: only it is named."""
    members = "[0, 1, 2]"
    dumps = {0: dump(0, steps(2, state="completed"), members),
             2: dump(2, [*steps(2, state="completed"), entry(3, state="started")], members)}
    (v,) = verdicts(dumps)
    assert (v.culprits, v.waiting, v.no_dump) == ({}, {0: 2}, [1])
    assert [(f.check, f.subject.label) for f in group_findings(v)] == [
        ("hang.traces.no_dump", "rank 1")]


def test_every_rank_dumped_one_that_completed_and_never_entered_the_next_is_named(
        ) -> None:
    """No dump missing: nobody to wait for, so the rank behind is the one named."""
    members = "[0, 1, 2]"
    dumps = {r: dump(r, steps(2 if r == 0 else 3, state="completed"), members)
             for r in range(3)}
    (v,) = verdicts(dumps)
    assert list(v.culprits) == [0] and v.waiting == {}


def test_a_ring_buffer_that_wrapped_is_compared_where_every_rank_has_entries() -> None:
    dumps = {r: dump(r, [entry(s) for s in range(3 + r, 10)]) for r in range(4)}
    (v,) = verdicts(dumps)
    assert (v.first_seq, v.last_seq, v.culprits) == (6, 9, {})


def test_a_truncated_dump_counts_as_no_dump_and_the_rest_is_judged(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for rank in (0, 1, 3):
        raw = {k: v for k, v in dump(rank, steps(3)).items() if k not in ("rank", "host_name")}
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(raw))
    (tmp_path / "rank_2").write_bytes(pickle.dumps(dump(2, steps(3)))[:40])
    section = traces_section(str(tmp_path), None)
    assert section.data["ranks_dumped"] == [0, 1, 3] and "rank_2" in section.data["unreadable"][0]
    assert [(f.check, f.subject.label) for f in section.findings] == [
        ("hang.traces.no_dump", "rank 2")]
