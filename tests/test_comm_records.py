"""comm's per-rank records read back on rank 0 (gpucheck.comm.records): a pairwise row or
an entry in the roll of ranks that does not read is a `comm.rank_record` WARN naming the
rank, left out of the verdicts, never a crash; healthy rows read whole and keep their
shape (`samples_gbps` and `path` only when the rank sent them)."""

from __future__ import annotations

import copy
from typing import Any

from gpucheck.comm.records import PairRow, crossing, read_comm
from gpucheck.comm.report import Verdicts, comm_sections
from gpucheck.records import read
from gpucheck.report import Report, Status
from gpucheck.subject import Subject
from tests.test_metrics_emitted import comm_result

BOUNDS = Verdicts(0.5, None, 0.9)


def _sections(result: dict[str, Any]) -> dict[str, Any]:
    return {s.name: s for s in comm_sections(result, BOUNDS)}


def _unread(result: dict[str, Any]) -> list[Any]:
    return [f for f in _sections(result)["comm"].findings if f.check == "comm.rank_record"]


def test_healthy_rows_read_whole_and_name_nothing() -> None:
    records = read_comm(comm_result())
    assert not records.unread and len(records.pairs) == 2
    assert _unread(comm_result()) == []


def test_a_row_keeps_its_shape_through_the_record() -> None:
    row = comm_result()["pairwise"]["pairs"][0]
    assert crossing(read(PairRow, row)) == row
    with_path = row | {"path": "NV18"}
    assert crossing(read(PairRow, with_path)) == with_path
    bare = {k: v for k, v in row.items() if k != "samples_gbps"}
    assert crossing(read(PairRow, bare)) == bare


def test_a_malformed_pairwise_row_is_named_and_left_out_never_a_crash() -> None:
    result = copy.deepcopy(comm_result())
    result["pairwise"]["pairs"][1]["bandwidth_gbps"] = "fast"
    sections = _sections(result)
    (found,) = [f for f in sections["comm"].findings if f.check == "comm.rank_record"]
    assert (found.status, found.action) == (Status.WARN, "fix-config")
    assert isinstance(found.subject, Subject) and found.subject.rank == 1
    matrix = sections["pairwise"].data["bandwidth_gbps (src row -> dst column)"]
    assert [row["src"] for row in matrix] == ["rank 0"]
    Report("comm", list(sections.values())).to_dict()


def test_a_malformed_entry_in_the_roll_of_ranks_is_named() -> None:
    result = copy.deepcopy(comm_result())
    result["ranks"][1]["host"] = None
    (found,) = _unread(result)
    assert isinstance(found.subject, Subject) and found.subject.rank == 1
    assert [r["rank"] for r in _sections(result)["comm"].data["ranks"]] == [0]


def test_a_pairwise_list_that_is_not_a_list_names_no_rank() -> None:
    result = copy.deepcopy(comm_result())
    result["pairwise"]["pairs"] = {"src": 0}
    (found,) = _unread(result)
    assert found.subject is None and found.status is Status.WARN


def test_a_malformed_node_to_node_link_names_its_receiver_and_the_rest_is_judged() -> None:
    from tests.test_comm_node_links import _again, _result

    healthy = _result("cuda", _again(1.0))
    result = copy.deepcopy(healthy)
    link = result["internode"]["links"][0]
    link["bandwidth_gbps"] = None
    sections = _sections(result)
    (found,) = [f for f in sections["comm"].findings if f.check == "comm.rank_record"]
    assert isinstance(found.subject, Subject) and found.subject.rank == link["dst"]
    assert len(sections["internode"].data["rails"]) == \
        len(_sections(healthy)["internode"].data["rails"]) - 1
    assert not [f for f in _sections(healthy)["comm"].findings
                if f.check == "comm.rank_record"]


def test_a_malformed_transport_entry_is_named_and_the_others_read() -> None:
    from tests.test_comm_nccl_log import _entry

    result = copy.deepcopy(comm_result())
    result["backend"] = "nccl"
    result["transport"] = [crossing(_entry(0, "ib_healthy.log", ["mlx5_0"])),
                           {"rank": 1, "state": "read", "transport": None, "ib_sysfs": []}]
    sections = _sections(result)
    (found,) = [f for f in sections["comm"].findings if f.check == "comm.rank_record"]
    assert isinstance(found.subject, Subject) and found.subject.rank == 1
    assert [row["rank"] for row in sections["transport"].data["ranks"]] == [0]


def test_lists_read_as_tuples_and_a_bad_value_is_quoted_short() -> None:
    import pytest

    from gpucheck.records import RecordError

    row = comm_result()["pairwise"]["pairs"][0]
    assert read(PairRow, row).samples_gbps == tuple(row["samples_gbps"])
    with pytest.raises(RecordError) as caught:
        read(PairRow, row | {"bandwidth_gbps": "x" * 500})
    assert "bandwidth_gbps" in str(caught.value) and len(str(caught.value)) < 120
