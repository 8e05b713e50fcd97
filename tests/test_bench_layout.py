"""CPU ranks re-placing their tensors between segments of the timed loop
(`gpucheck.bench.model`) and the marks that time the segments."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpucheck import timing
from gpucheck.bench.model import MAX_SEGMENTS, relayout, segment_sizes


@pytest.mark.parametrize(("iters", "sizes"), [
    (12, (3, 3, 3, 3)),  # the default CPU loop: four placements
    (13, (4, 3, 3, 3)),
    (6, (3, 3)),
    (5, (5,)),  # too short to split: one placement
    (1, (1,)),
])
def test_the_loop_is_split_into_segments_of_about_three_iterations(
        iters: int, sizes: tuple[int, ...]) -> None:
    assert segment_sizes(iters, relayout=True) == sizes


def test_a_long_loop_gets_at_most_the_segment_cap_and_loses_no_iteration() -> None:
    sizes = segment_sizes(1001, relayout=True)
    assert len(sizes) == MAX_SEGMENTS and sum(sizes) == 1001
    assert max(sizes) - min(sizes) <= 1


def test_without_relayout_the_loop_is_one_segment() -> None:
    assert segment_sizes(12, relayout=False) == (12,)


def small_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    model.eval()
    model[1].running_mean.uniform_()  # a buffer that is not all zeros
    return model


def test_relayout_moves_every_weight_and_the_batch_to_new_memory_keeping_values() -> None:
    model, batch = small_model(), torch.randn(2, 3, 8, 8)
    params = list(model.parameters())
    tensors = [*params, *model.buffers()]
    before = [(t.data_ptr(), t.detach().clone()) for t in tensors]
    with torch.inference_mode():  # as in the timed loop
        expected = model(batch)
        moved = relayout(model, batch)
        assert torch.equal(model(moved), expected)
    assert list(model.parameters()) == params  # the same objects: DDP keeps its references
    for tensor, (pointer, value) in zip(tensors, before, strict=True):
        assert tensor.data_ptr() != pointer and torch.equal(tensor, value)
        assert not tensor.is_inference()
    assert moved.data_ptr() != batch.data_ptr() and torch.equal(moved, batch)


def recorded_clocks(monkeypatch: pytest.MonkeyPatch, cpu_s: list[float],
                    wall_s: list[float]) -> None:
    """The marks read these clock values in turn (recorded, not this machine's timing):
    `process_time` (CPU time) and `perf_counter` (wall) at each mark."""
    from types import SimpleNamespace

    cpu, wall = iter(cpu_s), iter(wall_s)
    monkeypatch.setattr(timing, "time", SimpleNamespace(process_time=lambda: next(cpu),
                                                        perf_counter=lambda: next(wall)))


def test_marks_time_iterations_within_segments_and_not_the_gap_between_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two segments: two 10 ms iterations, 30 ms of re-placement between the segments
    # (computation: on both clocks), one 10 ms iteration.
    recorded_clocks(monkeypatch, [0.0, 0.010, 0.020, 0.050, 0.060],
                    [0.0, 0.010, 0.020, 0.050, 0.060])
    marks = timing.Marks("cpu", 5)
    marks.begin()
    marks.mark()
    marks.mark()
    marks.begin()
    marks.mark()
    took, ends = marks.read_ms()
    assert took == pytest.approx((10.0, 10.0, 10.0))  # the gap is in no iteration
    assert ends == pytest.approx((10.0, 20.0, 60.0))  # but it is on the timeline
    walls = marks.read_wall_ms()  # each iteration's wall time: the gap in none either
    assert walls == pytest.approx((10.0, 10.0, 10.0))
