#!/usr/bin/env bash
# After benchmarks/gpu_acceptance.py: the paths its first GPU run (H100, torch 2.11)
# found broken, run again on the GPU once fixed, in about 3 minutes. Every report lands
# under $OUT (or the folder given), each command's exit code on the terminal.
#     PYTHONPATH=. bash benchmarks/gpu_followup.sh [OUT]
set -u
out=${1:-${OUT:?give a folder or set OUT}}
mkdir -p "$out/r"
export PYTHONPATH=${PYTHONPATH:-.}
step() { echo "== $1"; shift; "$@" > "$out/r/$name.log" 2>&1; echo "rc=$?"; tail -n 12 "$out/r/$name.log"; }
name=shared step "gloo ranks sharing the GPU (comm skips send/recv, bench)" \
  timeout 120 python3 benchmarks/gpu_acceptance.py --out "$out/acc" --budget 110 \
  --skip env,nvml,flight,collectives,comm,stress,bench,p2p,comm_wait,comm_default
name=preflight step "preflight on NCCL, then the job's command" \
  timeout 100 python3 -m gpucheck preflight --budget 60 -o "$out/r/preflight.json" \
  -- echo JOB-STARTED
name=bench_torchrun step "bench under torchrun (DDP freed before its group)" \
  timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
  -m gpucheck bench --iters 20 -o "$out/r/bench_torchrun.json"
name=comm1 step "comm on one rank: no busbw" \
  timeout 45 python3 -m gpucheck comm --max-bytes 64M -o "$out/r/comm1.json"
name=health step "health (NVML only)" \
  timeout 30 python3 -m gpucheck health -o "$out/r/health.json"
tar czf "$out/followup.tar.gz" -C "$out" r && rm -rf "$out/r"
