"""`gpucheck stress`: every GPU at once, one rank per GPU: GEMM, memory bandwidth, silent
data corruption under load, host and peer copies, power (docs/stress.md)."""
