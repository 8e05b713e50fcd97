"""Probes for `gpucheck env`: each returns a `Section` and never prints or raises."""
