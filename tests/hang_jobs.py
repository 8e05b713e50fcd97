"""Rank programs that hang on purpose, for tests/test_hang_*.py and benchmarks/hang_speed.py.

Run as a rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, or under torchrun):
    python tests/hang_jobs.py MODE [ODD_RANK]
MODE:
- slow: a healthy job whose ranks take different times per step (the odd rank
  0.3 s, the others 0.05 s) before every all_reduce; never hangs by itself.
- user: the odd rank loops forever in `stuck_in_user_code` while the others wait in
  all_reduce.
- desync: the odd rank calls broadcast where the others call all_reduce; every rank
  writes its Flight Recorder dump (TORCH_FR_DUMP_TEMP_FILE) DUMP_AFTER_S seconds
  later, from a thread, as NCCL's watchdog does on a timeout.
Every rank prints "ready RANK" just before the step that hangs (slow: after its
first steps), and ends itself after LIFETIME_S whatever happens: nothing outlives a test.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

LIFETIME_S = 150.0
DUMP_AFTER_S = 1.5


def stuck_in_user_code() -> None:
    while True:
        time.sleep(0.2)


def slow(rank: int, odd: int, dist, t) -> None:  # type: ignore[no-untyped-def]
    for step in range(100_000):
        time.sleep(0.3 if rank == odd else 0.05)
        dist.all_reduce(t)
        if step == 3:
            print(f"ready {rank}", flush=True)


def desync(rank: int, odd: int, dist, t) -> None:  # type: ignore[no-untyped-def]
    from gpucheck.distributed import deadline

    def dump() -> None:
        # What gpucheck's own ranks do after a failed collective (deadline.dump_after_failure).
        outcome = deadline.dump_after_failure(rank, "gloo")
        print(f"dumped {rank}" if outcome and outcome.path else f"no dump {rank}: {outcome}",
              flush=True)

    threading.Timer(DUMP_AFTER_S, dump).start()
    print(f"ready {rank}", flush=True)
    if rank == odd:
        dist.broadcast(t, src=(odd + 1) % dist.get_world_size())
    else:
        dist.all_reduce(t)


def main() -> None:
    import torch
    import torch.distributed as dist

    threading.Timer(LIFETIME_S, lambda: os._exit(3)).start()
    mode = sys.argv[1]
    odd = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=LIFETIME_S))
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    if mode == "slow":
        slow(rank, odd, dist, t)
    elif mode == "desync":
        desync(rank, odd, dist, t)
    else:
        print(f"ready {rank}", flush=True)
        if rank == odd:
            stuck_in_user_code()
        dist.all_reduce(t)
    stuck_in_user_code()  # after the last step: only LIFETIME_S ends it


if __name__ == "__main__":
    main()
