"""`gpucheck hang --traces` on folders another user may have written: nothing in a dump
is ever run, links and FIFOs are not followed, and every odd dump gives a finding or a
one-line error, in bounded time (issue 24, items 1 and 9). The property test at the
end writes random dumps and asserts only that: exit 0, 1 or 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck.cli import main
from gpucheck.hang.findings import traces_section
from gpucheck.hang.traces import UnsafeDump
from gpucheck.report import Status


def entry(seq: Any, op: str = "all_reduce", **extra: Any) -> dict[str, Any]:
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "input_sizes": [[4]],
            "input_dtypes": ["Float"], "state": "scheduled", "is_p2p": False,
            "process_group": ("0", "default_pg"), **extra}


def dump(entries: Any, ranks: Any = "[0, 1, 2]", **extra: Any) -> dict[str, Any]:
    return {"version": "2.10", "entries": entries,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}, **extra}


def write(folder: Path, dumps: dict[int, Any]) -> Path:
    for rank, value in dumps.items():
        (folder / f"rank_{rank}").write_bytes(pickle.dumps(value))
    return folder


def run_traces(folder: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["hang", "--traces", str(folder), "--format", "json"])
    return code, out.getvalue(), err.getvalue()


def problems(folder: Path) -> list[tuple[str, str, str | None]]:
    section = traces_section(str(folder), None)
    return [(f.check, f.status.value, f.subject and f.subject.label) for f in section.findings]


class RunsCode:
    """What a hostile user drops as a dump: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_dump_whose_unpickling_would_run_code_is_refused_and_never_run(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = write(tmp_path, {0: dump([entry(1)]), 1: dump([entry(1)])})
    (folder / "rank_2").write_bytes(pickle.dumps(dump([entry(1)], evil=RunsCode(marker))))
    code, out, err = run_traces(folder)
    assert not marker.exists()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "rank_2" in err and "system" in err
    with pytest.raises(UnsafeDump):
        traces_section(str(folder), None)
    assert not marker.exists()


def test_links_and_fifos_among_the_dumps_are_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(pickle.dumps(dump([entry(1), entry(2)])))
    folder = tmp_path / "fr"
    folder.mkdir()
    write(folder, {0: dump([entry(1)]), 1: dump([entry(1)])})
    (folder / "rank_2").symlink_to(elsewhere)
    os.mkfifo(folder / "rank_3")  # opening it for reading would block
    section = traces_section(str(folder), None)
    assert section.data["ranks_dumped"] == [0, 1]
    assert [(f.check, f.subject.label) for f in section.findings] == [
        ("hang.traces.no_dump", "rank 2")]


def test_dumps_of_an_older_torch_without_collective_seq_id_are_judged(tmp_path: Path) -> None:
    older = [{k if k != "collective_seq_id" else "seq_id": v for k, v in entry(s).items()}
             for s in (1, 2)]
    write(tmp_path, {0: dump(older), 1: dump(older), 2: dump(older[:1])})
    assert problems(tmp_path) == [("hang.traces.missing", "FAIL", "rank 2")]


def test_entries_of_another_type_make_that_file_unreadable_not_a_traceback(
        tmp_path: Path) -> None:
    write(tmp_path, {0: dump([entry(1)]), 1: dump([entry(1)]), 2: dump("entries")})
    section = traces_section(str(tmp_path), None)
    assert "rank_2" in section.data["unreadable"][0] and section.data["ranks_dumped"] == [0, 1]
    assert [(f.check, f.subject.label) for f in section.findings] == [
        ("hang.traces.no_dump", "rank 2")]
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    write(only_bad, {0: dump({"a": 1}), 1: ["not", "a", "dump"]})
    code, _, err = run_traces(only_bad)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_records_that_are_not_records_are_skipped_and_counted(tmp_path: Path) -> None:
    odd = [entry(1), "x", 7, entry(True), entry(-3), entry("2"), {"nothing": 1}, entry(2)]
    write(tmp_path, {r: dump(odd) for r in range(3)})
    section = traces_section(str(tmp_path), None)
    assert section.data["entries_skipped"] == {"0": 6, "1": 6, "2": 6}
    assert [f.check for f in section.findings] == ["hang.traces.agree"]


def test_sequence_ids_far_apart_are_judged_without_counting_between(tmp_path: Path) -> None:
    write(tmp_path, {0: dump([entry(1), entry(10**12)]), 1: dump([entry(1), entry(10**12)]),
                     2: dump([entry(1)])})
    (finding,) = traces_section(str(tmp_path), None).findings
    assert (finding.check, finding.subject.label) == ("hang.traces.missing", "rank 2")
    assert f"#{10**12}" in finding.message


def test_dumps_with_no_entries_say_nothing_was_recorded_not_ok(tmp_path: Path) -> None:
    write(tmp_path, {r: dump([]) for r in range(3)})
    section = traces_section(str(tmp_path), None)
    assert [(f.check, f.status) for f in section.findings] == [("hang.traces.empty", Status.SKIP)]
    missing = tmp_path / "no-entries-key"
    missing.mkdir()
    write(missing, {0: {"version": "2.10", "pg_config": {}}})
    assert [f.check for f in traces_section(str(missing), None).findings] == [
        "hang.traces.empty"]


def test_a_group_listing_a_million_ranks_gives_a_short_finding(tmp_path: Path) -> None:
    ranks = "[" + ", ".join(map(str, range(1_000_000))) + "]"
    write(tmp_path, {r: dump([entry(1)], ranks=ranks) for r in range(3)})
    (finding,) = traces_section(str(tmp_path), None).findings
    assert finding.check == "hang.traces.no_dump" and len(finding.message) < 400


# Random dumps: a valid one with any part replaced by any plain value, or random bytes.
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30),
                    st.sampled_from([10**12, 2**63, -1, 0, 1]), st.floats(allow_nan=True),
                    st.text(max_size=6), st.binary(max_size=6),
                    st.sampled_from(["[0, 1]", "[[0]]", "gloo:all_reduce", "completed", "0"]))
PLAIN = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=3)),
    max_leaves=10)
FIELDS = st.sampled_from(["entries", "pg_config", "version", "collective_seq_id",
                          "process_group", "input_sizes", "profiling_name", "state", "ranks",
                          "is_p2p", "whole"])


def _mutated(field: str, value: Any) -> Any:
    base = dump([entry(1), entry(2)])
    if field == "whole":
        return value
    if field in base:
        base[field] = value
    elif field == "ranks":
        base["pg_config"]["0"]["ranks"] = value
    else:
        base["entries"][1][field] = value
    return base


@FUZZ
@given(st.lists(st.one_of(st.tuples(FIELDS, PLAIN).map(lambda fv: _mutated(*fv)),
                          st.binary(max_size=40)), min_size=1, max_size=4))
def test_random_dumps_give_a_verdict_or_a_one_line_error(files: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for rank, value in enumerate(files):
            data = value if isinstance(value, bytes) else pickle.dumps(value)
            (folder / f"rank_{rank}").write_bytes(data)
        code, _, err = run_traces(folder)
    assert code in (0, 1, 2)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _memo_bomb(levels: int = 30, width: int = 10) -> list[Any]:
    """A few hundred bytes once pickled (every level a memo reference to the one
    below), 10**30 lists once written out."""
    value: list[Any] = ["x"]
    for _ in range(levels):
        value = [value] * width
    return value


@pytest.mark.parametrize("field", ["version", "profiling_name"])
def test_a_tiny_dump_of_shared_nested_lists_is_unreadable_in_bounded_time(
        tmp_path: Path, field: str) -> None:
    import subprocess
    import sys

    bomb = _memo_bomb()
    dumps: dict[int, Any] = {0: dump([entry(0)]), 1: dump([entry(0)])}
    if field == "version":
        dumps[1]["version"] = bomb
    else:
        dumps[1]["entries"][0]["profiling_name"] = bomb
    write(tmp_path, dumps)
    assert (tmp_path / "rank_1").stat().st_size < 2000
    # A child process, so that today's code cannot take the test run's memory with it.
    proc = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--traces",
                           str(tmp_path), "--format", "json"], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode in (0, 1), proc.stderr
    assert "rank_1" in proc.stdout and "Traceback" not in proc.stderr
