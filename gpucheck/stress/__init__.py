"""`gpucheck stress`: every GPU at once, one rank per GPU.

gemm (TFLOP/s per dtype), membw (device copy GB/s), burn + sdc (silent data
corruption under load: the same product repeated and compared, across ranks and
with an fp64 CPU reference), copies (pinned host<->device, peer matrix), numa
(each rank on its GPU's NUMA node), specs (expected figures per GPU model),
verdicts (peers, expected, link), worker (the phases on every rank), report.
"""
