"""Reading reports back: `gpucheck compare`, `gpucheck fleet` and baselines. Report
files only: never torch, pynvml or the distributed frame (docs/fleet.md).
"""
