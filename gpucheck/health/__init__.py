"""`gpucheck health`: the node check a scheduler or a monitor runs (docs/health.md);
nothing in this package imports torch."""
