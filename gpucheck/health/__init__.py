"""`gpucheck health`: the node check a scheduler runs; nothing here imports torch."""
