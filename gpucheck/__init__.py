"""gpucheck: health checks and honest benchmarks for multi-GPU servers.

Importing this package never imports torch or starts NVML: both are loaded
lazily inside the probes, so `import gpucheck` and `gpucheck --help` work on a
machine with no driver and even with a broken torch.
"""

__version__ = "0.1.0"
