"""Harness overhead: gpucheck's reported images/s with 1 rank vs a bare loop.

Both run in fresh processes, interleaved (gpucheck, bare, gpucheck, bare, ...),
with the same model, dtype, memory format, batch, warm-up, iterations and
threads; the bare loop is the shortest honest timing of that work (inference
mode, device synchronisation before the clock is read). Prints the medians and
their ratio; the issue's bar is a ratio of at least 0.95.

    /work/venv/bin/python benchmarks/bench_overhead.py --runs 5
    /work/venv/bin/python benchmarks/bench_overhead.py --runs 5 -- --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BARE_LOOP = r"""
import sys, time, torch, torchvision
model_name, dtype_name, channels_last, batch, warmup, iters, threads, device = sys.argv[1:]
device = torch.device(device)
torch.set_num_threads(int(threads))
dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
fmt = torch.channels_last if channels_last == "True" else torch.contiguous_format
torch.manual_seed(0)
model = torchvision.models.get_model(model_name).eval().to(device=device, dtype=dtype,
                                                            memory_format=fmt)
x = torch.randn(int(batch), 3, 224, 224).to(device=device, dtype=dtype, memory_format=fmt)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
with torch.inference_mode():
    for _ in range(int(warmup)):
        model(x)
    sync()
    start = time.perf_counter()
    for _ in range(int(iters)):
        model(x)
    sync()
    elapsed = time.perf_counter() - start
print(int(batch) * int(iters) / elapsed)
"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def gpucheck_run(extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "r.json"
        subprocess.run([sys.executable, "-m", "gpucheck", "bench", "--n-gpus", "1", "--quiet",
                        "--output", str(out), *extra], env=env(), check=True, timeout=600)
        report = json.loads(out.read_text())
    setup = next(s for s in report["sections"] if s["name"] == "bench")["data"]
    timing = next(s for s in report["sections"] if s["name"] == "timing")["data"]
    return float(timing["aggregate_images_per_s"]), setup


def bare_run(setup: dict) -> float:
    args = [setup["model"], setup["dtype"], str(setup["channels_last"]), str(setup["batch_size"]),
            str(setup["warmup_iters"]), str(setup["timed_iters"]), str(setup["threads_per_rank"]),
            "cuda:0" if setup["device"] == "cuda" else "cpu"]
    done = subprocess.run([sys.executable, "-c", BARE_LOOP, *args], env=env(), check=True,
                          capture_output=True, text=True, timeout=600)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    ours, bare = [], []
    for i in range(args.runs):
        rate, setup = gpucheck_run(args.extra)
        ours.append(rate)
        bare.append(bare_run(setup))
        print(f"pair {i + 1}: gpucheck {ours[-1]:.2f} images/s, bare loop {bare[-1]:.2f} "
              f"images/s ({setup['model']} {setup['dtype']} batch {setup['batch_size']} x "
              f"{setup['timed_iters']} iters, {setup['threads_per_rank']} threads)", flush=True)
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"median gpucheck {statistics.median(ours):.2f} images/s, median bare loop "
          f"{statistics.median(bare):.2f} images/s: ratio {ratio:.3f} (bar: >= 0.95)")


if __name__ == "__main__":
    main()
