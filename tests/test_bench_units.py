"""The pure parts of bench: aggregation over handcrafted records, consistency, data split."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucheck.bench.consistency import compare_outputs, cpu_reference, reference_tolerance
from gpucheck.bench.findings import consistency_section, nodes_section
from gpucheck.bench.model import (
    default_images_dir,
    fill_batch,
    load_tensor,
    rank_share,
    scan_images,
)
from gpucheck.bench.pace import aggregate, job_wall_s
from gpucheck.bench.records import RankRecord
from gpucheck.report import Status


def record(rank: int, wall_s: float, span_s: float | None = None, host: str = "node0",
           node_rank: int = 0, images: int = 64) -> RankRecord:
    return RankRecord(
        rank=rank, host=host, node_rank=node_rank, local_rank=rank % 8, device=f"cuda:{rank}",
        device_name="NVIDIA H100", device_uuid=f"GPU-{rank}", images=images, iters=8,
        wall_s=wall_s, span_s=wall_s if span_s is None else span_s, device_s=wall_s * 0.9,
        peak_memory_bytes=1 << 30, threads=1, iter_ms=(wall_s * 1e3 / 8,) * 8,
    )


def test_job_wall_follows_the_last_rank_not_rank_zero() -> None:
    records = [record(0, 1.0, span_s=1.5), record(1, 1.0, span_s=1.5), record(2, 1.5)]
    summary = aggregate(records)
    assert summary.job_wall_s == 1.5
    assert summary.job_wall_s >= max(r.wall_s for r in records)
    assert summary.stragglers == (2,)
    assert summary.spread == pytest.approx(1.5)


def test_job_wall_is_never_shorter_than_any_ranks_own_time() -> None:
    # span_s below wall_s cannot happen on one clock, but the rule must hold anyway.
    assert job_wall_s([record(0, 2.0, span_s=1.0), record(1, 1.0, span_s=1.9)]) == 2.0


def test_aggregate_adds_up_images_and_device_time() -> None:
    records = [record(r, 1.0 + r / 100) for r in range(4)]
    summary = aggregate(records)
    assert summary.total_images == 4 * 64
    assert summary.summed_device_s == pytest.approx(sum(r.device_s for r in records))
    assert summary.aggregate_images_per_s == pytest.approx(256 / summary.job_wall_s)
    assert summary.parallel_efficiency == pytest.approx(
        summary.summed_device_s / (4 * summary.job_wall_s))
    assert summary.stragglers == ()


def test_aggregate_does_not_depend_on_record_order() -> None:
    records = [record(r, w) for r, w in enumerate([1.0, 1.3, 0.9])]
    assert aggregate(records) == aggregate(list(reversed(records)))


def test_ranks_are_grouped_by_node_and_a_slow_node_is_flagged() -> None:
    fast = [record(r, 1.0, host="a", node_rank=0) for r in range(4)]
    slow = [record(r, 1.4, host="b", node_rank=1) for r in range(4, 8)]
    summary = aggregate(fast + slow)
    assert [(n.host, n.ranks) for n in summary.nodes] == [("a", (0, 1, 2, 3)),
                                                          ("b", (4, 5, 6, 7))]
    section = nodes_section(summary.nodes, summary.threshold)
    warned = [f for f in section.findings if f.status is Status.WARN]
    assert [f.subject.label for f in warned] == ["b"]


def test_a_single_node_is_never_a_slow_node() -> None:
    summary = aggregate([record(0, 1.0), record(1, 3.0)])
    assert len(summary.nodes) == 1 and not summary.nodes[0].slow


def test_consistency_names_the_rank_that_disagrees() -> None:
    import torch

    base = torch.randn(4, 10)
    outputs = [base, base + 1e-6, base * 1.5, base]
    result = compare_outputs(outputs, "fp32")
    assert tuple(result.wrong) == (2,)
    assert result.max_deviation == result.deviations[2] > result.tolerance
    records = tuple(record(r, 1.0) for r in range(4))
    failed = [f for f in consistency_section(records, result, "fp32").findings
              if f.status is Status.FAIL]
    assert len(failed) == 1 and "rank 2" in failed[0].message and "GPU-2" in failed[0].message


def test_consistency_fails_on_non_finite_logits() -> None:
    import torch

    base = torch.randn(2, 10)
    bad = base.clone()
    bad[0, 0] = float("nan")
    result = compare_outputs([base, base, bad], "bf16")
    assert result.nonfinite_ranks == (2,) and tuple(result.wrong) == (2,)


def test_with_two_ranks_the_cpu_reference_names_the_wrong_one_only() -> None:
    import torch

    truth = torch.randn(4, 10)
    result = compare_outputs([truth * 1.5 + 1.0, truth + 1e-7], "fp32", reference=truth)
    assert tuple(result.wrong) == (0,) and result.undecided == ()
    assert "CPU reference" in result.wrong[0]
    records = (record(0, 1.0), record(1, 1.0))
    findings = consistency_section(records, result, "fp32", "CPU float32").findings
    assert [(f.status, f.subject.label) for f in findings] == [(Status.FAIL, "rank 0")]


def test_without_a_reference_two_disagreeing_ranks_are_a_warning_naming_both() -> None:
    import torch

    truth = torch.randn(4, 10)
    result = compare_outputs([truth * 1.5, truth], "fp32")
    assert tuple(result.wrong) == () and result.undecided == (0, 1)
    findings = consistency_section((record(0, 1.0), record(1, 1.0)), result, "fp32").findings
    assert [(f.status, f.subject.label) for f in findings] == [(Status.WARN, "rank 0, rank 1")]


def test_ranks_that_all_differ_from_the_reference_alike_point_at_the_software() -> None:
    import torch

    truth = torch.randn(4, 10)
    result = compare_outputs([truth * 1.1] * 3, "fp32", reference=truth)
    assert tuple(result.wrong) == (0, 1, 2)
    records = tuple(record(r, 1.0) for r in range(3))
    findings = consistency_section(records, result, "fp32").findings
    hints = {f.hint for f in findings}
    assert len(hints) == 1 and "software" in hints.pop()
    assert {(f.cause, f.action) for f in findings} == {("all_alike", "fix-config")}


def test_healthy_ranks_agree_with_each_other_and_the_reference() -> None:
    import torch

    truth = torch.randn(4, 10)
    result = compare_outputs([truth, truth + 1e-6], "bf16", reference=truth,
                             ref_tolerance=reference_tolerance("bf16", "cuda"))
    [finding] = consistency_section((record(0, 1.0), record(1, 1.0)), result, "bf16").findings
    assert finding.status is Status.OK and "CPU reference" in finding.message


def test_fp32_on_a_gpu_is_held_to_tf32_tolerance_against_the_reference() -> None:
    # cuDNN runs fp32 convolutions in TF32 by default: 10 mantissa bits, like fp16.
    assert reference_tolerance("fp32", "cuda") == reference_tolerance("fp16", "cuda") > (
        reference_tolerance("fp32", "cpu"))


def test_the_cpu_reference_matches_the_model_run_in_float32() -> None:
    import torch

    from gpucheck.bench.model import WeightsChoice, build_model

    images = scan_images(default_images_dir())
    files = images.files[:2]
    reference = cpu_reference("mobilenet_v3_small", WeightsChoice("random"), "fp32",
                              str(images.folder), files)
    with torch.inference_mode():
        direct = build_model("mobilenet_v3_small", WeightsChoice("random"))(
            load_tensor(images.folder, files))
    assert tuple(compare_outputs([direct], "fp32", reference=reference).wrong) == ()
    assert tuple(compare_outputs([direct * 1.01], "fp32", reference=reference).wrong) == (0,)


@pytest.mark.parametrize(("n_images", "world_size"), [(6, 1), (6, 2), (6, 4), (5, 3), (2, 3)])
def test_rank_share_matches_distributed_sampler(n_images: int, world_size: int) -> None:
    from torch.utils.data import DistributedSampler

    shares = [rank_share(n_images, r, world_size) for r in range(world_size)]
    for rank, share in enumerate(shares):
        sampler = DistributedSampler(range(n_images), num_replicas=world_size, rank=rank,
                                     shuffle=False)
        assert list(share.indices) == list(sampler)
    assert shares[0].padding == shares[0].padded_total - n_images
    assert set().union(*(s.indices for s in shares)) == set(range(n_images))  # none dropped


def test_sample_images_are_found_and_every_colour_mode_loads() -> None:
    images = scan_images(default_images_dir())
    assert len(images.files) == 6 and images.skipped == ()
    tensor = load_tensor(images.folder, images.files)
    assert tuple(tensor.shape) == (6, 3, 224, 224)
    assert abs(float(tensor.mean())) < 3


def test_broken_files_are_skipped_by_name(tmp_path: Path) -> None:
    import shutil

    shutil.copy(default_images_dir() / "chelsea.png", tmp_path / "cat.png")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (tmp_path / "notes.md").write_text("ignored quietly")
    images = scan_images(tmp_path)
    assert images.files == ("cat.png",)
    assert [name for name, _ in images.skipped] == ["broken.jpg"]


def test_fill_batch_cycles_the_ranks_images() -> None:
    import torch

    images = torch.arange(3.0).view(3, 1)
    assert fill_batch(images, 7).view(-1).tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert fill_batch(images, 2).shape[0] == 2


