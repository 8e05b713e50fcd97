"""The pure parts of stress: expected figures (membw counted once, as nvbandwidth), PCIe
arithmetic, sysfs NUMA, SDC judgement, peer/straggler/link verdicts, report building,
option validation."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from plant import Plant, install

from gpucheck import agreement, numa, timing
from gpucheck.cli import main
from gpucheck.report import Status
from gpucheck.stress import burn, gemm, rank, verdicts
from gpucheck.stress.report import Verdicts, stress_sections
from gpucheck.stress.verdicts import p2p_findings
from gpucheck.subject import node

NODE0 = node(0)

# --- expected figures -------------------------------------------------------------------


def test_h200_sxm_has_the_measured_bf16_figure_and_its_source() -> None:
    figure = gemm.gemm_figure("NVIDIA H200", "bf16")
    assert figure is not None and figure.measured
    assert figure.peak == 989.5 and figure.typical == pytest.approx(791.6)
    assert "790" in figure.source or "798" in figure.source


@pytest.mark.parametrize("name", ["NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                                  "NVIDIA A100 80GB PCIe", "Tesla V100-SXM2-16GB", "", None])
def test_models_without_data_get_no_expected_figure(name: str | None) -> None:
    assert gemm.gemm_figure(name, "bf16") is None
    assert gemm.copy_figure(name) is None


def test_every_listed_figure_names_its_source_and_a_sane_fraction() -> None:
    for model in gemm.MODELS.values():
        for figure in [*model.gemm_tflops.values(), model.copy_gbps]:
            assert figure.source and 0.5 <= figure.typical_fraction <= 0.95


def test_memory_peaks_are_half_the_datasheet_figures_as_a_copy_counted_once() -> None:
    peaks = {name: gemm.copy_figure(name).peak for name in gemm.MODELS}  # type: ignore[union-attr]
    assert peaks == {"NVIDIA H200": 4800.0 / 2, "NVIDIA H100 80GB HBM3": 3350.0 / 2,
                     "NVIDIA A100-SXM4-80GB": 2039.0 / 2, "NVIDIA A100-SXM4-40GB": 1555.0 / 2}


def test_a_copy_counts_its_bytes_once_as_nvbandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    # nvbandwidth device_local_copy: copy size x loops / time (memcpy.cpp, doMemcpyCore).
    monkeypatch.setattr(gemm, "timed_window", lambda *a, **k: [0.002, 0.001, 0.001])
    record = gemm.measure_copy(0, 4 << 20, "cpu", "cpu", 0.0, 0.0)
    assert record.gbps_p50 == pytest.approx((4 << 20) / 0.001 / 1e9)
    assert record.gbps == pytest.approx(3 * (4 << 20) / 0.004 / 1e9)


def test_the_h200_copy_figure_is_the_measured_fraction_of_half_the_datasheet() -> None:
    figure = gemm.copy_figure("NVIDIA H200")
    assert figure is not None and figure.measured
    # 4.3 TB/s read + write measured = 2.15 TB/s copied; 0.89 of 2400 GB/s.
    assert figure.typical == pytest.approx(2136.0)
    assert "2.15 TB/s" in figure.source and "half of the datasheet" in figure.source


def _rank(rank: int, gpu: str | None, node_rank: int = 0, **extra: Any) -> dict[str, Any]:
    """A rank row as the worker builds it: the check-in record plus the GPU's label."""
    label = f"GPU {rank} ({gpu}, bus 00000000:{rank + 16:02X}:00.0, GPU-{rank})" if gpu else None
    return {"rank": rank, "node_rank": node_rank, "host": f"n{node_rank}", "local_rank": rank,
            "device": f"cuda:{rank} {gpu}" if gpu else "cpu", "gpu": label, "gpu_name": gpu,
            **extra}


def test_an_unknown_model_is_skipped_never_warned_however_slow() -> None:
    ranks = [_rank(0, "NVIDIA H200 NVL"), _rank(1, "NVIDIA L40S")]
    found = verdicts.expected_findings("stress.gemm.expected", "bf16", "TFLOP/s",
                                       {0: 1.0, 1: 2.0}, ranks,
                                       lambda m: gemm.gemm_figure(m, "bf16"), 0.8)
    assert {f.status for f in found} == {Status.SKIP}
    assert "NVIDIA H200 NVL" in found[0].message


def test_a_gpu_below_its_models_typical_figure_is_named() -> None:
    ranks = [_rank(0, "NVIDIA H200"), _rank(1, "NVIDIA H200")]
    found = verdicts.expected_findings("stress.gemm.expected", "bf16", "TFLOP/s",
                                       {0: 780.0, 1: 560.0}, ranks,
                                       lambda m: gemm.gemm_figure(m, "bf16"), 0.8)
    warned = [f for f in found if f.status is Status.WARN]
    assert [f.subject.label for f in warned] == ["rank 1"]
    assert "GPU 1" in warned[0].message and "source" in warned[0].message
    assert any(f.status is Status.OK and "1 NVIDIA H200" in f.message for f in found)


def test_a_healthy_h200_at_nvbandwidths_figure_stays_ok_and_a_slow_one_is_named() -> None:
    # 2150 GB/s is what nvbandwidth prints for a healthy H200's device_local_copy; before
    # the unit was fixed, the figure expected 4272 GB/s of it and this was a false WARN.
    ranks = [_rank(0, "NVIDIA H200"), _rank(1, "NVIDIA H200")]
    healthy = verdicts.expected_findings("stress.membw.expected", "copy", "GB/s",
                                         {0: 2150.0, 1: 2120.0}, ranks, gemm.copy_figure, 0.8)
    assert [f.status for f in healthy] == [Status.OK]
    slow = verdicts.expected_findings("stress.membw.expected", "copy", "GB/s",
                                      {0: 2150.0, 1: 1200.0}, ranks, gemm.copy_figure, 0.8)
    warned = [f for f in slow if f.status is Status.WARN]
    assert len(warned) == 1 and "GPU 1" in str(warned[0].subject or "") + warned[0].message


# --- PCIe link arithmetic and sysfs -----------------------------------------------------


@pytest.mark.parametrize(("gts", "width", "gbps"), [
    (2.5, 1, 0.25), (5.0, 16, 8.0), (8.0, 16, 15.754), (16.0, 16, 31.508),
    (32.0, 16, 63.015), (64.0, 16, 121.0), (16.0, 8, 15.754),
    (None, 16, None), (16.0, None, None), (12.0, 16, None)])  # unknown: no rate
def test_link_rate_is_lanes_times_the_encoded_lane_rate(gts: float | None, width: int | None,
                                                        gbps: float | None) -> None:
    assert rank.link_rate_gbps(gts, width) == (gbps and pytest.approx(gbps, rel=1e-3))


@pytest.mark.parametrize(("text", "value"), [("32.0 GT/s PCIe", 32.0), ("8 GT/s", 8.0),
                                             ("2.5 GT/s PCIe", 2.5), ("Unknown", None),
                                             ("", None), (None, None)])
def test_link_speed_parses_every_kernel_form(text: str | None, value: float | None) -> None:
    assert rank.parse_speed(text) == value


def test_cpulist_parses_and_prints_the_kernels_form() -> None:
    assert numa.parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert numa.parse_cpulist("") == () and numa.parse_cpulist("zz") == ()
    assert numa.cpulist((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert numa.cpulist(()) == ""


def fake_gpu(root: Path, bus: str = "0000:9a:00.0", node: str = "1", cpus: str = "4-7",
             speed: str = "16.0 GT/s PCIe", width: str = "16",
             max_speed: str = "32.0 GT/s PCIe") -> Path:
    folder = root / "bus" / "pci" / "devices" / bus
    folder.mkdir(parents=True)
    for name, text in (("numa_node", node), ("local_cpulist", cpus),
                       ("current_link_speed", speed), ("current_link_width", width),
                       ("max_link_speed", max_speed), ("max_link_width", "16")):
        (folder / name).write_text(text + "\n")
    return folder


def test_sysfs_is_found_from_nvmls_bus_id_form(tmp_path: Path) -> None:
    fake_gpu(tmp_path)  # the NUMA node and its CPUs: tests/test_numa.py
    assert numa.pci_dir("00000000:9A:00.0", tmp_path).name == "0000:9a:00.0"
    link = rank.read_link("00000000:9A:00.0", tmp_path)
    assert link.rate_gbps == pytest.approx(31.5, rel=1e-2)
    assert link.label() == "Gen4 x16 (capable of Gen5 x16)"


def test_a_platform_without_numa_reads_as_unknown(tmp_path: Path) -> None:
    fake_gpu(tmp_path, node="-1", cpus="")
    placement, target = rank.plan_placement("0000:9a:00.0", (0, 1), pin=True, root=tmp_path)
    assert placement.numa_node is None and placement.on_gpu_node is None and target is None


@pytest.mark.parametrize(("allowed", "pin", "target", "cpus", "on_node", "pinned"), [
    (tuple(range(8)), True, (4, 5, 6, 7), (4, 5, 6, 7), True, True),  # pinned to its node
    ((0, 1, 2, 3), True, None, (0, 1, 2, 3), False, False),  # bound off it: said so
    (tuple(range(8)), False, None, tuple(range(8)), False, False),  # spanning, unpinned
    ((5, 6), False, None, (5, 6), True, False)])
def test_a_ranks_placement_against_its_gpus_node(
        tmp_path: Path, allowed: tuple[int, ...], pin: bool, target: tuple[int, ...] | None,
        cpus: tuple[int, ...], on_node: bool, pinned: bool) -> None:
    fake_gpu(tmp_path)
    placement, planned = rank.plan_placement("0000:9a:00.0", allowed, pin, tmp_path)
    assert planned == target and placement.cpus == cpus
    assert (placement.on_gpu_node, placement.pinned) == (on_node, pinned)


# --- SDC judgement ----------------------------------------------------------------------


def test_two_ranks_that_disagree_are_told_apart_by_the_cpu_reference() -> None:
    verdict = agreement.judge({0: "aa", 1: "bb"}, {0: 1e-7, 1: 0.3}, tolerance=1e-4)
    assert list(verdict.wrong) == [1] and verdict.undecided == ()
    assert "reference" in verdict.wrong[1]


def test_healthy_ranks_are_all_agreeing() -> None:
    verdict = agreement.judge({r: "aa" for r in range(8)}, dict.fromkeys(range(8), 1e-7), 1e-4)
    assert verdict.wrong == {} and verdict.undecided == ()
    assert verdict.agreeing(list(range(8))) == list(range(8))


def test_a_non_finite_result_is_wrong() -> None:
    verdict = agreement.judge({0: "aa", 1: "bb", 2: "cc"}, {0: math.inf, 1: math.nan, 2: 0.0}, 1e-4)
    assert list(verdict.wrong) == [0, 1]
    # The same non-finite bits on two ranks are alike: software (gpucheck.stress.burn).
    alike = agreement.judge({0: "aa", 1: "aa"}, {0: math.inf, 1: math.nan}, 1e-4, splits=True)
    assert alike.wrong == {} and alike.software == ((0, 1),)


def test_ranks_of_different_models_are_not_compared_bitwise() -> None:
    verdict = agreement.judge({0: "aa", 1: "bb"}, {0: 1e-6, 1: 1e-6}, 1e-4,
                              groups={0: "H100", 1: "A100"})
    assert verdict.wrong == {} and verdict.undecided == ()


def test_a_two_two_split_is_settled_by_the_reference() -> None:
    verdict = agreement.judge({0: "aa", 1: "aa", 2: "bb", 3: "bb"},
                              {0: 1e-7, 1: 1e-7, 2: 0.5, 3: 0.5}, 1e-4, splits=True)
    # 2 and 3 are wrong alike (the same bits): a software split the reference settles.
    assert verdict.wrong == {} and verdict.undecided == () and verdict.software == ((2, 3),)
    apart = agreement.judge({0: "aa", 1: "aa", 2: "bb", 3: "cc"},
                            {0: 1e-7, 1: 1e-7, 2: 0.5, 3: 0.5}, 1e-4, splits=True)
    assert list(apart.wrong) == [2, 3] and apart.software == ()


def test_majority_vote_needs_a_strict_majority() -> None:
    assert agreement.odd_by_majority({0: "a", 1: "b"}) is None
    assert agreement.odd_by_majority({0: "a", 1: "a", 2: "b", 3: "b"}) is None
    assert agreement.odd_by_majority({0: "a", 1: "a"}) == ()
    assert agreement.odd_by_majority({0: "a", 1: "b", 2: "a"}) == (1,)


def test_relative_deviation_is_scaled_by_the_reference_and_inf_when_not_finite() -> None:
    ref = torch.tensor([[10.0, -20.0]], dtype=torch.float64)
    assert agreement.relative_deviation(torch.tensor([[10.0, -19.0]]), ref) == pytest.approx(0.05)
    assert agreement.relative_deviation(torch.tensor([[math.nan, 1.0]]), ref) == math.inf


def test_row_checks_change_with_any_single_element() -> None:
    out = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    before = burn.row_checks(out)
    changed = out.clone()
    changed[5, 3] = torch.nextafter(changed[5, 3], torch.tensor(math.inf))  # one ulp
    after = burn.row_checks(changed)
    assert torch.nonzero((before != after).any(dim=1)).flatten().tolist() == [5]
    assert burn.digest_of(before) != burn.digest_of(after)


def test_large_products_check_a_row_of_every_tile_band_plus_the_rows_that_differ() -> None:
    n = 2048
    same = torch.zeros(n, 2, dtype=torch.int64)
    odd = same.clone()
    odd[[3, 100, 2000], 0] = 1
    drawn = burn.rows_to_check(n, [same, same], seed=7)
    assert [r // burn.TILE_ROWS for r in drawn] == list(range(n // burn.TILE_ROWS))
    assert burn.rows_to_check(n, [same, same], seed=7) == drawn  # one draw, every rank
    assert burn.rows_to_check(n, [same, same], seed=8) != drawn  # another run, other rows
    assert {3, 100, 2000} <= set(burn.rows_to_check(n, [same, odd], seed=7))
    assert burn.rows_to_check(512, [same[:512], odd[:512]]) == list(range(512))


def test_the_cpu_reference_is_the_fp64_product_of_the_seeded_inputs() -> None:
    from gpucheck.stress.gemm import seeded_pair

    a, b = seeded_pair(64, burn.SDC_SEED, "cpu", "fp32", on_cpu=True)
    reference = burn.reference_and_bounds(64, "fp32", [0, 5])[0]
    assert torch.allclose(reference, (a.double() @ b.double())[[0, 5]])
    assert agreement.relative_deviation((a @ b)[[0, 5]], reference) < burn.TOLERANCE["fp32"]


# --- timing, peers, stragglers, links -----------------------------------------------------


def test_one_hiccup_does_not_move_the_median_iteration() -> None:
    stats = timing.summarise([0.010] * 49 + [0.500])
    assert stats.p50_s == 0.010 and stats.p99_s == 0.500 and stats.iters == 50


def test_healthy_jitter_between_three_ranks_raises_no_peer_warning() -> None:
    ranks = [_rank(r, "NVIDIA H200") for r in range(3)]
    found = verdicts.peer_findings("stress.gemm.peers", "bf16", "TFLOP/s",
                                   {0: 791.0, 1: 752.0, 2: 770.0}, ranks, 0.9)
    assert [f.status for f in found] == [Status.OK]


def test_a_rank_slow_throughout_is_named_against_its_nodes_median() -> None:
    ranks = [_rank(r, "NVIDIA H200") for r in range(8)]
    values = dict.fromkeys(range(8), 790.0) | {5: 640.0}
    found = verdicts.peer_findings("stress.gemm.peers", "bf16", "TFLOP/s", values, ranks, 0.9)
    assert [(f.status, f.subject.label) for f in found] == [(Status.WARN, "rank 5")]
    assert "0.81x" in found[0].message
    assert "GPU 5 (NVIDIA H200, bus 00000000:15:00.0, GPU-5)" in found[0].message


def test_a_straggler_is_slower_in_time_not_faster() -> None:
    ranks = [_rank(r, None) for r in range(3)]
    found = verdicts.peer_findings("stress.sdc.straggler", "median time", "ms",
                                   {0: 10.0, 1: 10.4, 2: 13.0}, ranks, 0.9,
                                   higher_is_better=False)
    assert [(f.status, f.subject.label) for f in found] == [(Status.WARN, "rank 2")]
    fast = verdicts.peer_findings("stress.sdc.straggler", "t", "ms", {0: 10.0, 1: 10.0, 2: 7.0},
                                  ranks, 0.9,
                                  higher_is_better=False)
    assert [f.status for f in fast] == [Status.OK]


def test_peers_are_compared_within_their_node_only() -> None:
    ranks = [_rank(0, "A"), _rank(1, "A"), _rank(2, "B", node_rank=1),
             _rank(3, "B", node_rank=1)]
    found = verdicts.peer_findings("stress.gemm.peers", "x", "u",
                                   {0: 100.0, 1: 100.0, 2: 50.0, 3: 50.0},
                                   ranks, 0.9)
    assert [f.status for f in found] == [Status.OK]


def test_one_rank_has_no_peers_to_compare_with() -> None:
    found = verdicts.peer_findings("stress.gemm.peers", "x", "u", {0: 1.0}, [_rank(0, None)], 0.9)
    assert [f.status for f in found] == [Status.SKIP]


def test_host_copies_are_judged_against_the_links_rate() -> None:
    ranks = [_rank(0, "G"), _rank(1, "G"), _rank(2, "G")]
    rows = [{"rank": 0, "h2d_gbps": 26.0, "d2h_gbps": 25.0, "link": "Gen4 x16",
             "link_gbps": 31.5},
            {"rank": 1, "h2d_gbps": 12.0, "d2h_gbps": 25.0, "link": "Gen4 x16",
             "link_gbps": 31.5},
            {"rank": 2, "h2d_gbps": 12.0, "d2h_gbps": 12.5, "link": None, "link_gbps": None}]
    found = verdicts.link_findings("stress.copies.link", rows, ranks, 0.6)
    assert [(f.status, f.subject and f.subject.label) for f in found] == [
        (Status.WARN, "rank 1"), (Status.SKIP, None)]
    healthy = verdicts.link_findings("stress.copies.link", rows[:1], ranks, 0.6)
    assert [f.status for f in healthy] == [Status.OK]


def _pairs(gbps: dict[tuple[int, int], float | None]) -> dict[str, Any]:
    return {"gpus": [{}] * 3, "pairs": [{"src": s, "dst": d, "peer_access": v is not None,
                                         "gbps": v} for (s, d), v in gbps.items()]}


def test_gpus_without_any_peer_access_are_skipped_and_a_blocked_pair_warned() -> None:
    none = {(s, d): None for s in range(3) for d in range(3) if s != d}
    assert [f.status for f in p2p_findings(_pairs(none), NODE0, 0.6)] == [Status.SKIP]
    cells = {(s, d): 380.0 for s in range(3) for d in range(3) if s != d} | {(0, 1): None}
    found = p2p_findings(_pairs(cells), NODE0, 0.6)
    assert [f.status for f in found] == [Status.WARN] and "cuda:0->cuda:1" in found[0].message


# --- report from a handcrafted GPU result ---------------------------------------------------


def gpu_result(bf16: dict[int, float], numa_off: int | None = None,
               spanning: int | None = None) -> dict[str, Any]:
    """`numa_off`: that rank runs only on the other node's CPUs; `spanning`: on both
    nodes' (not pinned)."""
    cpus = {numa_off: "8-15", spanning: "0-15"}
    ranks = [_rank(r, "NVIDIA H200", cpus=cpus.get(r, "0-7"), numa_node=0, gpu_cpus="0-7",
                   on_gpu_numa_node=r not in (numa_off, spanning), pinned=False, pid=100 + r)
             for r in bf16]
    gemm = [{"rank": r, "dtype": "bf16", "size": 8192, "iters": 1000, "tflops": v,
             "tflops_p50": v, "p50_ms": 1.39, "p99_ms": 1.5} for r, v in bf16.items()]
    return {"world_size": len(bf16), "device": "cuda", "backend": "nccl", "dtypes": ["bf16"],
            "size": 8192, "duration_s": 30.0, "ranks": ranks, "gemm": gemm, "membw": None,
            "sdc": None, "copies": None, "p2p": None, "phases_planned": ["gemm"],
            "phases_done": ["gemm"], "complete": False}


def findings_of(sections: list[Any], status: Status) -> list[tuple[str, str | None]]:
    return [(f.check, f.subject and f.subject.label) for s in sections for f in s.findings
            if f.status is status]


def test_a_healthy_h200_node_reports_no_warning() -> None:
    sections = stress_sections(gpu_result({0: 791.0, 1: 780.0, 2: 770.0}),
                               Verdicts(0.9, 0.8, 0.6))
    assert findings_of(sections, Status.WARN) == []
    assert ("stress.gemm.expected", None) in findings_of(sections, Status.OK)


def test_a_slow_h200_is_warned_by_its_peers_and_its_expected_figure() -> None:
    sections = stress_sections(gpu_result({0: 791.0, 1: 600.0, 2: 785.0}),
                               Verdicts(0.9, 0.8, 0.6))
    assert findings_of(sections, Status.WARN) == [("stress.gemm.peers", "rank 1"),
                                                  ("stress.gemm.expected", "rank 1")]
    row = sections[1].data["results"][1]
    assert row["expected_tflops"] == pytest.approx(791.6) and row["vs_expected"] < 0.8


def test_a_rank_off_its_gpus_numa_node_is_warned() -> None:
    sections = stress_sections(gpu_result({0: 790.0, 1: 790.0}, numa_off=1),
                               Verdicts(0.9, 0.8, 0.6))
    assert findings_of(sections, Status.WARN) == [("stress.numa", "rank 1")]


def test_an_unpinned_rank_spanning_both_nodes_is_no_warning_but_said() -> None:
    # --no-numa-pin under torchrun's default: the rank may run on every CPU.
    sections = stress_sections(gpu_result({0: 790.0, 1: 790.0}, spanning=1),
                               Verdicts(0.9, 0.8, 0.6))
    assert findings_of(sections, Status.WARN) == []
    said = [f.message for s in sections for f in s.findings if f.check == "stress.numa"]
    assert len(said) == 1 and "rank(s) 1 also on other nodes' CPUs (not pinned" in said[0]


# --- options --------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["--dtypes", "fp64"], "--dtypes"), (["--dtypes", "tf32"], "on CPU ranks"),
    (["--duration", "-1"], "--duration"), (["--duration", "0"], "--duration"),
    (["--peer-threshold", "0"], "greater than 0"), (["--expected-threshold", "1.5"],
    "at most 1"), (["--copy-threshold", "-0.2"], "greater than 0"), (["--size", "4"], "--size")])
def test_bad_options_are_a_one_line_usage_error(capsys: pytest.CaptureFixture[str],
                                                argv: list[str], words: str) -> None:
    assert main(["stress", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_burn_in_that_slows_after_its_first_product_still_ends_at_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk between clock checks is sized from the first product; a GPU (here a
    planted sleep) that turns slow afterwards must not run a whole chunk past the
    deadline: with the deadline already past, the burn stops at its minimum repetitions."""
    def slow_after_first(rank: int, phase: str, iteration: int, out: Any) -> None:
        if iteration > 0:
            time.sleep(0.002)

    install(Plant(stress=slow_after_first), monkeypatch.setattr)
    record, _, _ = burn.burn(0, "fp32", 64, "cpu", "cpu", 0.0, "g")
    assert record.iters == burn.MIN_REPEATS
