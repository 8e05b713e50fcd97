"""`gpucheck hang`: which rank a stuck distributed job waits for, and what it is doing:
procs find the ranks, observe watches them, findings judge (live, or from the Flight
Recorder dumps traces reads); live builds the report across nodes."""
