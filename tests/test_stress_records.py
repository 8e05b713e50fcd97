"""stress's per-rank records read back on rank 0 (gpucheck.stress.records): typed, and a
record that does not read is a `stress.rank_record` WARN naming the rank, its figures left
out of the verdicts, never a crash. A healthy result reads whole and the JSON keeps its
shape (the tables hold exactly the fields the ranks sent)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpucheck.records import RecordError, as_dict, read
from gpucheck.report import Report, Status
from gpucheck.stress.records import CopyRow, GemmRecord, read_stress
from gpucheck.stress.report import Verdicts, stress_sections
from gpucheck.subject import Subject
from tests.test_metrics_emitted import stress_result

BOUNDS = Verdicts(0.9, 0.8, 0.6)


def _sections(result: dict[str, Any]) -> dict[str, Any]:
    return {s.name: s for s in stress_sections(result, BOUNDS)}


def _unread(result: dict[str, Any]) -> list[Any]:
    return [f for f in _sections(result)["stress"].findings if f.check == "stress.rank_record"]


def test_a_healthy_result_reads_whole_and_names_nothing() -> None:
    records = read_stress(stress_result())
    assert not records.unread
    assert [type(r) for r in records.gemm] == [GemmRecord] * 4
    assert [type(r) for r in records.copies] == [CopyRow] * 2
    assert _unread(stress_result()) == []


def test_the_tables_hold_the_fields_the_ranks_sent() -> None:
    result = stress_result()
    section = _sections(result)["gemm"]
    sent = [{k: v for k, v in row.items()} for row in result["gemm"]]
    assert [{k: r[k] for k in sent[0]} for r in section.data["results"]] == sent
    assert set(section.data["results"][0]) - set(sent[0]) == {
        "vs_peers", "expected_tflops", "vs_expected"}


@pytest.mark.parametrize(("phase", "broken"), [
    ("gemm", lambda r: r["gemm"][1].pop("tflops_p50")),
    ("gemm", lambda r: r["gemm"][1].update(tflops_p50="fast")),
    ("membw", lambda r: r["membw"][1].update(gbps_p50=None)),
    ("sdc", lambda r: r["sdc"]["records"][1].update(digest=7)),
    ("copies", lambda r: r["copies"]["rows"][1].update(h2d_together_gbps=[1])),
])
def test_a_malformed_record_is_named_and_left_out_never_a_crash(
        phase: str, broken: Any) -> None:
    result = copy.deepcopy(stress_result())
    broken(result)
    sections = _sections(result)
    (found,) = [f for f in sections["stress"].findings if f.check == "stress.rank_record"]
    assert (found.status, found.action) == (Status.WARN, "fix-config")
    assert isinstance(found.subject, Subject) and found.subject.rank == 1
    table = sections[phase].data["results"]
    assert len(table) == len(_sections(stress_result())[phase].data["results"]) - 1
    assert 0 in {row["rank"] for row in table}


def test_a_record_that_is_not_a_record_names_no_rank() -> None:
    result = copy.deepcopy(stress_result())
    result["membw"][1] = "garbage"
    (found,) = _unread(result)
    assert found.subject is None and found.status is Status.WARN


def test_a_malformed_entry_in_the_roll_of_ranks_leaves_the_others_judged() -> None:
    result = copy.deepcopy(stress_result())
    del result["ranks"][1]["node_rank"]
    sections = _sections(result)
    (found,) = [f for f in sections["stress"].findings if f.check == "stress.rank_record"]
    assert isinstance(found.subject, Subject) and found.subject.rank == 1
    assert [r["rank"] for r in sections["stress"].data["ranks"]] == [0]
    Report("stress", list(sections.values())).to_dict()  # renders to JSON


def test_burn_in_deviations_stay_with_their_rank_when_one_record_is_dropped() -> None:
    result = copy.deepcopy(stress_result())
    result["sdc"]["reference_deviations"] = [0.5, 0.25]
    result["sdc"]["records"][0].pop("group")
    table = _sections(result)["sdc"].data["results"]
    assert [(r["rank"], r["reference_deviation"]) for r in table] == [(1, 0.25)]


def test_read_checks_every_field_and_round_trips() -> None:
    row = stress_result()["gemm"][0]
    record = read(GemmRecord, row)
    assert as_dict(record) == row and json.dumps(as_dict(record)) == json.dumps(row)
    assert read(GemmRecord, row | {"newer_field": 1}) == record
    for bad in ({**row, "rank": True}, {**row, "iters": 1.5}, {**row, "dtype": None}):
        with pytest.raises(RecordError):
            read(GemmRecord, bad)
    with pytest.raises(RecordError, match="no tflops"):
        read(GemmRecord, {k: v for k, v in row.items() if k != "tflops"})


def test_a_malformed_peer_copy_pair_is_named_and_its_node_still_judged() -> None:
    result = copy.deepcopy(stress_result())
    result["p2p"]["nodes"][0]["pairs"][1]["gbps"] = "fast"
    sections = _sections(result)
    (found,) = [f for f in sections["stress"].findings if f.check == "stress.rank_record"]
    assert found.status is Status.WARN and found.subject is None
    (matrix,) = [v for k, v in sections["p2p"].data.items() if k.endswith("matrix")]
    assert matrix[1]["to cuda:0"] is None and matrix[0]["to cuda:1"] == 300.0
    assert {f.check for f in sections["p2p"].findings} == {"stress.p2p"}


def test_a_peer_copy_matrix_without_its_node_is_named() -> None:
    result = copy.deepcopy(stress_result())
    del result["p2p"]["nodes"][0]["host"]
    sections = _sections(result)
    assert [f.check for f in sections["stress"].findings if f.status is Status.WARN] == [
        "stress.rank_record"]
    assert sections["p2p"].data == {}


def test_a_second_look_keeps_the_suspects_it_was_measured_for() -> None:
    result = copy.deepcopy(stress_result())
    result["membw_again"] = [row | {"suspects": [1]} for row in result["membw"]]
    result["membw_again"][0]["gbps_p50"] = None  # one that does not read: left out
    shown = _sections(result)["membw"].data["measured again"]
    assert shown == [result["membw_again"][1]]
    assert _unread(result)[0].subject.rank == 0
