"""Launching and joining a torch.distributed job. Knows nothing of bench or comm:
callers hand it a worker function. torch is imported lazily, inside functions."""
