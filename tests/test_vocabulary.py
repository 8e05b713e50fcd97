"""The core vocabulary (issue 25): Bound, SecondLook, Metric, Subject, Check, units."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from gpucheck import subject
from gpucheck.checks.check import Action, Cause, Check, Status, both, build, docs_of, title_of
from gpucheck.measure import Better, Bound, LookState, Metric, SecondLook
from gpucheck.stats import fmt_bytes, human_bytes
from gpucheck.subject import Kind, Subject


@pytest.mark.parametrize(("bound", "value", "reference", "worse"), [
    (Bound.fraction(0.8, Better.HIGHER), 79, 100, True),
    (Bound.fraction(0.8, Better.HIGHER), 80, 100, False),
    (Bound.fraction(0.8, Better.HIGHER), 120, 100, False),
    (Bound.fraction(0.8, Better.LOWER), 126, 100, True),  # the same rule: limit 1 / 0.8
    (Bound.fraction(0.8, Better.LOWER), 125, 100, False),
    (Bound.fraction(0.8, Better.LOWER), 50, 100, False),
    (Bound.shortfall(0.1, Better.LOWER), 1.11, 1.0, True),
    (Bound.shortfall(0.1, Better.LOWER), 1.09, 1.0, False),
    (Bound.shortfall(0.1, Better.HIGHER), 0.89, 1.0, True),
    (Bound.fraction(0.5, Better.HIGHER), 0.0, 0.0, False),  # no reference: never worse
    (Bound.fraction(0.5, Better.HIGHER), -1.0, 0.0, False)])
def test_a_bound_judges_both_ways(bound: Bound, value: float, reference: float,
                                  worse: bool) -> None:
    assert bound.worse(value, reference) is worse


@pytest.mark.parametrize(("fraction", "better"), [
    (0.0, Better.HIGHER), (-0.5, Better.HIGHER), (1.5, Better.HIGHER), (1.0, Better.INFO)])
def test_a_fraction_out_of_range_or_an_info_figure_has_no_bound(fraction: float,
                                                                 better: Better) -> None:
    with pytest.raises(ValueError):
        Bound.fraction(fraction, better) if better is Better.HIGHER else Bound(fraction, better)


def _look(state: LookState = LookState.CONFIRMED, again: float | None = 41.0) -> SecondLook:
    return SecondLook(first=40.0, again=again, reference=80.0,
                      against=(subject.pair(2, 5),), unit="GB/s",
                      bound=Bound.fraction(0.7, Better.HIGHER), state=state)


def test_second_look_round_trips_through_json_shapes() -> None:
    look = _look()
    shared = SecondLook(40.0, None, 80.0, (), "GB/s", look.bound, LookState.CONFIRMED,
                        parts=(look, _look(LookState.UNSTABLE, 79.0)))
    for each in (look, shared, _look(LookState.NOT_MEASURED, None)):
        assert SecondLook.from_dict(each.to_dict()) == each


def test_a_look_not_measured_again_has_no_second_figure() -> None:
    with pytest.raises(ValueError):
        _look(LookState.NOT_MEASURED, 41.0)
    with pytest.raises(ValueError):
        _look(LookState.CONFIRMED, None)


def test_metric_key_keeps_todays_names() -> None:
    gemm = Metric("stress.gemm.bf16.tflops", "TFLOP/s", Better.HIGHER, 400.0, subject.rank(3))
    assert gemm.key() == "stress.gemm.bf16.tflops.rank3"
    assert Metric("comm.x", "GB/s", Better.HIGHER, 1.0, subject.pair(0, 1, by="cuda")).key() \
        == "comm.x.cuda0_to_cuda1"
    assert Metric("comm.all_reduce.busbw_gbps@1048576", "GB/s", Better.HIGHER, 1.0).key() \
        == "comm.all_reduce.busbw_gbps@1048576"
    assert Metric.from_dict(gemm.to_dict()) == gemm


@pytest.mark.parametrize(("made", "position"), [
    (subject.rank(3), "rank3"), (subject.gpu(5, bus_id="0000:17:00.0"), "gpu5"),
    (subject.pair(0, 1), "rank0_to_rank1"), (subject.pair(0, 1, by="cuda"), "cuda0_to_cuda1"),
    (subject.node(2, host="n2"), "node2"), (subject.port("mlx5_0/1"), None),
    (subject.host("n1"), None), (subject.file("/x"), None), (subject.text("y"), None),
    (subject.ranks([0, 5], "rank 0, rank 5"), None),
])
def test_subject_positions_and_round_trip(made: Subject, position: str | None) -> None:
    assert made.position() == position
    assert Subject.from_dict(made.to_dict()) == made
    assert str(made) == made.label


@pytest.mark.parametrize("raw", [
    {"kind": "rank", "label": 3}, {"kind": "rank", "label": "r", "rank": "3"},
    {"kind": "rank", "label": "r", "rank": True}, {"kind": "planet", "label": "x"}, [],
    *({"kind": "ranks", "label": "r", "ranks": bad} for bad in ([0, "5"], "0,5", [True])),
])
def test_damaged_subjects_are_refused(raw: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        Subject.from_dict(raw)  # type: ignore[arg-type]


def test_units() -> None:
    assert human_bytes(64 << 20) == "64 MiB" and human_bytes(1536) == "1536 B"
    assert fmt_bytes(3 << 29) == "1.5 GiB"


_SLOW = Check("comm.pairwise.slow_pair", "send/recv per pair", both(Action.RERUN),
              "one short run",
              causes=(Cause("cpu_ranks", Action.RERUN, "busy process"),
                      Cause("fail_only", Action.DRAIN_NODE, "x", Status.FAIL)),
              on_look=MappingProxyType({LookState.CONFIRMED: Action.DRAIN_NODE,
                                        LookState.UNSTABLE: Action.RERUN,
                                        LookState.NOT_MEASURED: Action.RERUN}))


def test_check_refuses_what_it_does_not_declare() -> None:
    with pytest.raises(ValueError):
        _SLOW.action(Status.WARN, "no_such_cause")
    with pytest.raises(ValueError):
        _SLOW.action(Status.WARN, "fail_only")
    plain = Check("gpu.busy", "m", {Status.WARN: Action.RERUN}, "w")
    with pytest.raises(ValueError):
        plain.action(Status.WARN, look=_look())
    with pytest.raises(ValueError):
        plain.action(Status.FAIL)
    with pytest.raises(ValueError):
        Check("a.b", "m", {Status.OK: Action.NONE}, "w")
    with pytest.raises(ValueError, match="twice"):
        build([Check("a.b", "m", both(Action.RERUN), "w")] * 2)


def test_title_and_docs_anchor_come_from_the_id_unless_given() -> None:
    assert title_of("gpu.pcie.width") == "GPU PCIe width"
    assert title_of("comm.{op}.busbw_baseline") == "Comm <collective> bus bandwidth baseline"
    assert title_of("{command}.rank_failed") == "<command> rank failed"
    assert docs_of("kernel_log.xid") == "docs/xid.md#kernel-log-xid"
    assert docs_of("{command}.probe") == "docs/all.md#command-probe"
    made = Check("ib.port.rate", "m", {}, "w")
    assert (made.title, made.docs_anchor) == ("InfiniBand port rate", "docs/health.md#ib-port-rate")
    given = Check("preflight.no_go", "m", {}, "w", title="Preflight no-go", docs_anchor="d#a")
    assert (given.title, given.docs_anchor) == ("Preflight no-go", "d#a")
    assert Kind("pair") is Kind.PAIR


def test_a_subject_reads_as_its_label_and_crosses_processes_whole() -> None:
    import copy
    import pickle
    made = subject.gpu(3, "GPU 3 (H200)", bus_id="0000:17:00.0")
    assert str(made) == f"{made}" == "GPU 3 (H200)" and made != "GPU 3 (H200)"
    assert made != subject.gpu(4, "GPU 3 (H200)")  # same words, another GPU
    assert pickle.loads(pickle.dumps(made)) == made == copy.deepcopy(made)
    assert pickle.loads(pickle.dumps(made)).bus_id == "0000:17:00.0"
    with pytest.raises(AttributeError):
        made.gpu = 5
    assert subject.text("rank 3").label == "rank 3" and subject.text("rank 3").rank is None
