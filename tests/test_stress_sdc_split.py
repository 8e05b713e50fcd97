"""A software difference between nodes is a software split (WARN, fix-config), never a
row of drain-node FAILs; the group key holds the cuBLAS actually loaded and the
settings that change its kernel choice. Judged on recorded digests."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from gpucheck import agreement
from gpucheck.probes.torch_build import mapped_paths
from gpucheck.report import Status
from gpucheck.stress import burn
from gpucheck.stress.report import Verdicts, stress_sections

GROUP = "NVIDIA H100 80GB HBM3, 132 SMs, torch 2.14.1, CUDA 13.0, cuBLAS 13.1.1"


def _rank(rank: int, node: int) -> dict[str, Any]:
    return {"rank": rank, "node_rank": node, "host": f"n{node}", "local_rank": rank % 4,
            "device": f"cuda:{rank % 4}", "gpu": f"GPU {rank % 4}", "gpu_name": "NVIDIA H100"}


def _record(rank: int, digest: str) -> dict[str, Any]:
    return {"rank": rank, "dtype": "bf16", "size": 8192, "mode": "bitwise", "iters": 9000,
            "duration_s": 30.0, "bad_iters": 0, "first_bad_iter": None, "worst_elements": 0,
            "p50_ms": 1.5, "p99_ms": 1.6, "digest": digest, "group": GROUP}


def _result(digests: dict[int, str], deviations: dict[int, float],
            per_node: int = 4) -> dict[str, Any]:
    ranks = [_rank(r, r // per_node) for r in digests]
    return {"world_size": len(ranks), "device": "cuda", "backend": "nccl", "dtypes": ["bf16"],
            "size": 8192, "duration_s": 30.0, "ranks": ranks, "gemm": None, "membw": None,
            "sdc": {"dtype": "bf16", "size": 8192, "duration_s": 30.0, "tolerance": 1.0,
                    "rows_checked": 64, "records": [_record(r, d) for r, d in digests.items()],
                    "reference_deviations": [deviations[r] for r in digests]},
            "copies": None, "p2p": None, "phases_planned": ["sdc"], "phases_done": ["sdc"]}


def _sdc_findings(result: dict[str, Any]) -> list[Any]:
    sections = stress_sections(result, Verdicts(0.9, 0.8, 0.6))
    return [f for s in sections if s.name == "sdc" for f in s.findings]


# Three nodes of four: node 2 runs another cuBLAS (digest "b"), all within the reference.
NODE_SPLIT = {r: ("b" if r >= 8 else "a") for r in range(12)}


def test_a_node_with_other_software_is_one_software_split_not_four_drains() -> None:
    found = _sdc_findings(_result(NODE_SPLIT, dict.fromkeys(range(12), 0.3)))
    assert [f for f in found if f.status is Status.FAIL] == []
    split = [f for f in found if f.check == "stress.sdc.software_split"]
    assert len(split) == 1 and split[0].status is Status.WARN
    assert split[0].action == "fix-config" and "8-11" in str(split[0].subject or "")


def test_the_reference_decides_which_side_of_a_split_is_right() -> None:
    deviations = {r: (3.0 if r >= 8 else 0.3) for r in range(12)}
    verdict = agreement.judge(NODE_SPLIT, deviations, 1.0, dict.fromkeys(range(12), GROUP),
                              {r: r // 4 for r in range(12)}, splits=True)
    assert verdict.wrong == {} and verdict.software == ((8, 9, 10, 11),)
    found = _sdc_findings(_result(NODE_SPLIT, deviations))
    split = next(f for f in found if f.check == "stress.sdc.software_split")
    assert "beyond 1 (worst 3)" in split.message and "within 1 (worst 0.3)" in split.message


def test_a_whole_node_outvoted_with_mixed_digests_is_still_a_software_split() -> None:
    digests = {r: (f"x{r}" if r >= 8 else "a") for r in range(12)}
    verdict = agreement.judge(digests, dict.fromkeys(range(12), 0.3), 1.0,
                              dict.fromkeys(range(12), GROUP), {r: r // 4 for r in range(12)},
                              splits=True)
    assert verdict.wrong == {} and verdict.software == ((8, 9, 10, 11),)


def test_a_whole_node_each_wrong_its_own_way_beyond_the_reference_is_four_fails() -> None:
    """Other bits on every GPU of a node AND each off the fp64 reference: no software
    gives four answers on one node's identical GPUs; these are wrong GPUs (before,
    a software split: a WARN that drains nothing)."""
    digests = {r: (f"x{r}" if r >= 8 else "a") for r in range(12)}
    deviations = {r: (3.0 if r >= 8 else 0.3) for r in range(12)}
    verdict = agreement.judge(digests, deviations, 1.0, dict.fromkeys(range(12), GROUP),
                              {r: r // 4 for r in range(12)}, splits=True)
    assert sorted(verdict.wrong) == [8, 9, 10, 11] and verdict.software == ()
    found = _sdc_findings(_result(digests, deviations))
    assert [f for f in found if f.check == "stress.sdc.software_split"] == []
    assert len([f for f in found if f.status is Status.FAIL]) == 4


def test_two_outvoted_ranks_on_different_nodes_that_agree_are_software() -> None:
    digests = {r: ("b" if r in (1, 6) else "a") for r in range(8)}
    verdict = agreement.judge(digests, dict.fromkeys(range(8), 0.3), 1.0,
                              dict.fromkeys(range(8), GROUP), {r: r // 4 for r in range(8)},
                              splits=True)
    assert verdict.wrong == {} and verdict.software == ((1, 6),)


def test_one_odd_gpu_among_healthy_nodes_is_still_a_hardware_fail() -> None:
    digests = {r: ("b" if r == 9 else "a") for r in range(12)}
    found = _sdc_findings(_result(digests, dict.fromkeys(range(12), 0.3)))
    fails = [(f.check, f.subject and f.subject.label, f.action) for f in found
             if f.status is Status.FAIL]
    assert fails == [("stress.sdc.agreement", "rank 9", "drain-node")]
    assert not any(f.check == "stress.sdc.software_split" for f in found)


def test_two_odd_gpus_with_different_wrong_bits_are_two_fails() -> None:
    digests = {r: {3: "b", 9: "c"}.get(r, "a") for r in range(12)}
    found = _sdc_findings(_result(digests, dict.fromkeys(range(12), 0.3)))
    assert [f.subject.label for f in found if f.status is Status.FAIL] == ["rank 3", "rank 9"]


def test_a_healthy_multi_node_burn_in_stays_ok() -> None:
    found = _sdc_findings(_result(dict.fromkeys(range(12), "a"), dict.fromkeys(range(12), 0.3)))
    assert {f.status for f in found} == {Status.OK}
    sections = stress_sections(_result(dict.fromkeys(range(12), "a"),
                                       dict.fromkeys(range(12), 0.3)), Verdicts(0.9, 0.8, 0.6))
    groups = next(s for s in sections if s.name == "sdc").data["kernel_groups"]
    assert groups == [{"group": GROUP, "ranks": "0-11"}]


# --- the group key ------------------------------------------------------------------------


def test_the_loaded_cublas_and_its_settings_are_in_the_group_key(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42    /opt/site/lib/libcublas.so.12\n"
                    "7f20-7f30 r--p 00000000 00:00 0 \n")
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TORCH_BLAS_PREFER_CUBLASLT": "1",
           "HOME": "/root"}
    found = burn.loaded_blas(None, env, maps)
    assert found.path == "/opt/site/lib/libcublas.so.12"
    assert ("CUBLAS_WORKSPACE_CONFIG", ":4096:8") in found.settings
    assert ("TORCH_BLAS_PREFER_CUBLASLT", "1") in found.settings
    assert "HOME" not in found.key() and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in found.key()
    other = burn.loaded_blas(None, {}, maps)
    assert other.key() != found.key()  # another workspace setting: another group


class _FakeCublas:
    """A stand-in libcublas: cublasGetProperty answers 12.4.5."""

    @staticmethod
    def cublasGetProperty(prop: int, value: Any) -> int:
        ctypes.cast(value, ctypes.POINTER(ctypes.c_int))[0] = (12, 4, 5)[prop]
        return 0


def test_the_cublas_version_is_read_from_the_library_itself() -> None:
    assert burn.library_version("libcublas.so.12", lambda _: _FakeCublas()) == ("12.4.5", None)
    version, why = burn.library_version("libz.so", lambda _: object())
    assert version is None and "cublasGetProperty" in (why or "")


def test_without_a_mapped_cublas_the_version_is_unknown_with_why(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n")
    found = burn.loaded_blas(None, {}, maps)
    assert found.cublas is None and "no libcublas" in (found.why_unknown or "")
    assert found.key().startswith("cuBLAS unknown")


def test_this_process_reads_the_cublas_it_loaded() -> None:
    torch = pytest.importorskip("torch")
    if not mapped_paths(burn.CUBLAS):
        pytest.skip("this torch build maps no libcublas (a CPU-only build)")
    found = burn.loaded_blas(None)
    assert found.cublas is not None and found.cublas.count(".") == 2, found.why_unknown
    assert torch is not None


def test_torchs_blas_choices_join_the_key_or_say_they_were_not_read() -> None:
    class _Cuda:
        @staticmethod
        def preferred_blas_library() -> str:
            return "_BlasBackend.Cublaslt"

    class _Private:
        @staticmethod
        def _cuda_getCublasWorkspaceSize() -> int:
            return 33554432

        @staticmethod
        def _cuda_getCublasLtWorkspaceSize() -> int:
            raise RuntimeError("CUDA driver version is insufficient\nmore")

    class _Torch:
        backends = type("backends", (), {"cuda": _Cuda})
        _C = _Private

    settings = dict(burn.torch_settings(_Torch))
    assert settings["torch blas"] == "Cublaslt"
    assert settings["workspace bytes"] == "33554432"
    assert settings["Lt workspace bytes"].startswith("not read (CUDA driver")


def test_a_torch_getter_refusing_without_words_is_not_read_not_a_crash() -> None:
    def silent() -> int:
        raise RuntimeError()

    assert burn._read(silent) == "not read (RuntimeError)"  # IndexError before
