"""gpucheck: health checks and honest benchmarks for multi-GPU servers. Importing it
never imports torch or starts NVML (both load lazily inside the probes)."""

__version__ = "0.1.0"
