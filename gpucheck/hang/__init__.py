"""`gpucheck hang`: which rank a stuck distributed job waits for, and what it is doing.

procs (find the rank processes) -> observe (py-spy stacks, process state, CPU, NVML per
process) -> verdict (the rank the others wait for); or traces (Flight Recorder dumps,
read with torch's own reader, judged here) -> the rank that differs from the others.
"""
