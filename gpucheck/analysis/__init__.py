"""Reading reports back: `gpucheck compare` and `gpucheck fleet`, and baselines.

Everything here works on report files only (JSON dicts): it never imports torch,
pynvml or the distributed frame, so it runs on any laptop. `metrics` turns a report
into named metrics with a direction and unit (the one list every analysis uses),
`facts` into versions, hardware and run settings; `compare` and `fleet` build the
sections of their reports; `baseline` saves expected values and judges against them.
"""
