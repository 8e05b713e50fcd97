"""The job's command in the preflight tests: a small gloo script that joins its own
process group from the launcher's environment (env://), all_reduces rank + 1 and prints
one JSON line: what it saw (its pid and parent, the sum, gpucheck's variables left)."""

from __future__ import annotations

import datetime
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print("TRAIN " + json.dumps({
    "rank": dist.get_rank(), "sum": value.item(), "pid": os.getpid(), "ppid": os.getppid(),
    "master_port": os.environ.get("MASTER_PORT"),
    "gpucheck_vars": sorted(k for k in os.environ if k.startswith("GPUCHECK_")),
    "nccl_blocking_wait": os.environ.get("TORCH_NCCL_BLOCKING_WAIT"),
}), flush=True)
dist.destroy_process_group()
