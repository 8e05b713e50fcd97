"""Non-finite, negative and absurd option values are usage errors: exit 2, one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.cli import build_parser, main
from gpucheck.distributed.world import MAX_HOSTS, expand_nodelist

ROOT = Path(__file__).resolve().parents[1]

REPORT = str(Path(__file__).resolve().parent / "data" / "reports" / "bench.json")

BAD = [
    ("bench", "--timeout", "nan"), ("bench", "--timeout", "-1"), ("comm", "--timeout", "inf"),
    ("bench", "--duration", "inf"), ("all", "--duration", "inf"), ("stress", "--duration", "-5"),
    ("env", "--nvml-timeout", "inf"), ("env", "--nvml-timeout", "nan"),
    ("comm", "--pair-bytes", "-1"), ("comm", "--max-bytes", "infK"),
    ("comm", "--min-bytes", "nanM"), ("comm", "--min-bytes", "0"),
    ("comm", "--iters", "0"), ("comm", "--warmup", "-1"), ("comm", "--baseline-busbw", "nan"),
    ("comm", "--pair-threshold", "-0.5"), ("bench", "--iters", str(10**30)),
    ("bench", "--batch-size", "0"), ("bench", "--straggler-threshold", "inf"),
    ("stress", "--size", "-3"), ("stress", "--copy-threshold", "nan"),
    ("stress", "--n-gpus", str(10**30)), ("bench", "--n-gpus", "-2"),
    ("bench", "--master-port", "70000"), ("bench", "--iters", "٣"),
    ("fleet", "--mad-k", "nan"), ("fleet", "--expect-nodes", "0"),
    ("health", "--budget", "inf"), ("health", "--valid-for", "nan"),
    ("health", "--expect-gpus", "-1"), ("health", "--nvml-timeout", "inf"),
    ("hang", "--window", "nan"), ("hang", "--nvml-timeout", "inf"),
    ("preflight", "--budget", "1e10"), ("preflight", "--budget", "1e20"),
    ("preflight", "--budget", "0"), ("preflight", "--budget", "x"),
    ("health", "--valid-for", "1e12"), ("health", "--budget", "1e10"),
    ("health", "--nvml-timeout", "1e10"), ("health", "--budget", "0"),
]


def _argv(command: str, option: str, value: str) -> list[str]:
    positional = {"fleet": [REPORT], "compare": [REPORT, REPORT]}.get(command, [])
    return [command, *positional, f"{option}={value}"]


@pytest.mark.parametrize(("command", "option", "value"), BAD)
def test_a_bad_number_is_a_one_line_usage_error(command: str, option: str, value: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_argv(command, option, value)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err and "Traceback" not in err


@pytest.mark.parametrize(("command", "option", "value", "parsed"), [
    ("bench", "--timeout", "30", 30.0), ("bench", "--warmup", "0", 0),
    ("comm", "--pair-bytes", "64K", 65536), ("comm", "--max-bytes", "1.5M", 1572864),
    ("env", "--nvml-timeout", "2.5", 2.5), ("stress", "--duration", "0.5", 0.5),
    ("bench", "--master-port", "29500", 29500), ("fleet", "--expect-nodes", "16", 16),
])
def test_sound_values_still_parse(command: str, option: str, value: str,
                                  parsed: float) -> None:
    args = build_parser().parse_args(_argv(command, option, value))
    dest = {"--pair-bytes": "pair_bytes", "--max-bytes": "max_bytes"}.get(
        option, option.lstrip("-").replace("-", "_"))
    assert getattr(args, dest) == parsed


def test_n_gpus_far_beyond_the_node_is_refused_before_any_rank_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_STEP_NUM_TASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main(["comm", "--device", "cpu", "--n-gpus", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "far beyond this node" in err


def test_a_huge_node_range_is_refused_without_expanding_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="more than"):
        expand_nodelist("gpu[1-999999999]")
    with pytest.raises(ValueError, match="more than"):
        expand_nodelist("a[1-90000],b[1-90000]")
    with pytest.raises(ValueError, match="more than"):
        expand_nodelist("a[" + ",".join(["1-90000"] * 3) + "]")
    assert len(expand_nodelist(f"gpu[1-{MAX_HOSTS}]")) == MAX_HOSTS  # the bound itself holds
    assert main(["fleet", REPORT, "--nodes", "gpu[1-999999999]"]) == 2
    assert "more than" in capsys.readouterr().err


def test_a_rank_count_beyond_any_node_is_refused_before_torch_loads() -> None:
    code = ("import sys; from gpucheck.cli import main; "
            "rc = main(['bench', '--n-gpus', '100000']); print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "--n-gpus 100000 is far beyond this node" in done.stderr


def test_the_gpus_at_most_are_the_nvidia_gpus_on_the_pci_bus(tmp_path: Path) -> None:
    from health_fakes import gpu_node_sysfs

    from gpucheck.commands.launch import _gpus_at_most
    from gpucheck.devices import SYSFS_VAR

    assert _gpus_at_most({SYSFS_VAR: str(gpu_node_sysfs(tmp_path, gpus=3))}) == 3
    missing = {SYSFS_VAR: str(tmp_path / "missing")}
    assert _gpus_at_most(missing) == sys.maxsize  # never refuses wrongly


def test_an_option_prefix_is_refused_naming_the_option_and_help_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--n-gpu", "2"]) == 2
    assert "did you mean '--n-gpus'?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "a prefix such as --n-gpu is refused" in " ".join(capsys.readouterr().out.split())
