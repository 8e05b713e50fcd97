"""`gpucheck health`: the node check a scheduler or a monitor runs every few minutes.

The fast subset of `env` that needs no torch: NVML per GPU (judged by the same
`gpucheck.probes.gpu_judge` rules as `env`), the GPU count, Xid lines since the last
check, InfiniBand/RoCE ports from sysfs; all under a time budget (`budget`), with a
state directory (`state`) so that what was reported once is not reported forever.
Nothing in this package imports torch, at import time or later.
"""
