"""An NCCL collective timing out under gpucheck's own path, on ONE GPU (issue 33): a
1-rank NCCL all_reduce behind a ~10 s GPU sleep, a 3 s timeout, through
`process_group`, comm's `time_batch`, the dump, the abort and `os._exit`.

    python benchmarks/nccl_timeout_probe.py --out $OUT/probe            # one GPU
    python benchmarks/nccl_timeout_probe.py --out /tmp/probe --dry-run  # CPU, seconds

OUT/probe.json: seconds from the timeout to the exit (goal: under timeout + 10 s); the
dump and the stuck op's state in it (goal: not completed); `gpucheck hang --traces` on
the dumps (OUT/hang.json); the threads left. A failure is a finding, never a crash;
the rank is killed at --timeout + --sleep + 90 s. --dry-run: gloo on the CPU with a
stand-in op (no NCCL, so no abort), part of the suite (tests/test_nccl_deadline.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "rank_"
EXIT_GOAL_S = 10.0


class Stalled:
    """The dry run's stand-in for an all_reduce stuck behind a GPU sleep."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def is_completed(self) -> bool:
        return time.monotonic() >= self.until

    def wait(self) -> bool:
        return True

    def block_current_stream(self) -> None:
        pass


def note(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def threads_now() -> dict[str, Any]:
    """Python's threads and the process's native ones (the NCCL watchdog, the
    heartbeat monitor) by name: what would outlive the command without os._exit."""
    task = Path("/proc/self/task")
    native = []
    for entry in sorted(task.iterdir()) if task.is_dir() else []:
        try:
            native.append((entry / "comm").read_text().strip())
        except OSError:
            continue
    return {"python": sorted(t.name for t in threading.enumerate()), "native": native}


def _stalled_op(args: argparse.Namespace, tensor: Any) -> Any:
    """The launch to time: an all_reduce queued behind a GPU sleep, or the stand-in."""
    if args.dry_run:
        return lambda: Stalled(args.sleep)
    import torch
    import torch.distributed as dist

    props = torch.cuda.get_device_properties(0)
    hz = float(getattr(props, "clock_rate", 0) or 1_500_000) * 1000  # clock_rate: kHz
    spin: Any = torch.cuda._sleep  # untyped in torch: cycles on the current stream
    spin(int(args.sleep * hz))  # NCCL's stream waits on the current one
    return lambda: dist.all_reduce(tensor, async_op=True)


def rank(args: argparse.Namespace) -> int:
    """The rank itself: gpucheck's frame, the stuck op, gpucheck's way out."""
    import torch
    import torch.distributed as dist

    from gpucheck.comm import collectives
    from gpucheck.context import RunContext
    from gpucheck.distributed import deadline, session

    backend, device = ("gloo", "cpu") if args.dry_run else ("nccl", "cuda")
    version: Any = torch.cuda.nccl.version  # untyped in torch
    nccl = version() if torch.cuda.is_available() else None
    note("start", torch=torch.__version__, nccl=str(nccl), backend=backend)
    ctx = RunContext()

    def run() -> int:
        try:
            with session.process_group(backend, device, args.timeout, fault_watch=False,
                                       ctx=ctx):
                tensor = torch.ones(4, device=device)
                dist.all_reduce(tensor)  # a completed collective before the stuck one
                deadline.synchronize(device)
                launch = _stalled_op(args, tensor)
                note("issued")
                collectives.time_batch([launch], collectives.make_clock(device), True,
                                       args.timeout)
                note("completed")
        except Exception as exc:
            note("raised", type=type(exc).__name__, comm_error=session.is_comm_error(exc),
                 message=str(exc)[:300], aborted=ctx.session.aborted,
                 backstop=ctx.session.backstop, threads=threads_now())
            return 1
        return 0
    return deadline.exit_after_abort(lambda: ctx.session.aborted, run)


def _events(path: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            found[str(event["event"])] = event
    return found


def run_rank(args: argparse.Namespace, out: Path, folder: Path) -> dict[str, Any]:
    """Start the rank, wait for it (killed at the bound), time its exit."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_BLOCKING_WAIT"}
    env.update(TORCH_FR_DUMP_TEMP_FILE=str(folder / PREFIX), TORCH_FR_BUFFER_SIZE="200",
               PYTHONPATH=str(ROOT))
    argv = [sys.executable, str(Path(__file__).resolve()), "--rank", "--out", str(out),
            "--timeout", str(args.timeout), "--sleep", str(args.sleep)]
    argv += ["--dry-run"] if args.dry_run else []
    bound = args.timeout + args.sleep + 90
    with open(out / "rank.out", "w") as stdout, open(out / "rank.err", "w") as stderr:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=stdout, stderr=stderr)
        try:
            code: int | None = proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    ended = time.time()
    events = _events(out / "rank.out")
    issued = events.get("issued", {}).get("t")
    raised = events.get("raised", {})
    return {"exit_code": code, "killed_after_s": None if code is not None else bound,
            "start": events.get("start"), "raised": raised or None,
            "completed_instead": "completed" in events,
            "launch_to_raise_s": _span(issued, raised.get("t")),
            "timeout_to_exit_s": _span(None if issued is None else issued + args.timeout,
                                       ended)}


def _span(began: float | None, ended: float | None) -> float | None:
    return None if began is None or ended is None else round(ended - began, 3)


def dumps_seen(folder: Path) -> dict[str, Any]:
    """gpucheck's dump and torch's (if the watchdog wrote one): the last all_reduce's
    state in each."""
    from gpucheck.distributed.deadline import own_path
    from gpucheck.hang.traces import NotADump, read_dump

    seen: dict[str, Any] = {}
    for who, path in (("gpucheck", own_path(str(folder / PREFIX), 0)),
                      ("torch", str(folder / f"{PREFIX}0"))):
        if not os.path.exists(path):
            seen[who] = {"exists": False}
            continue
        try:
            entries = read_dump(path).get("entries", [])
        except (NotADump, AttributeError) as exc:
            seen[who] = {"exists": True, "unreadable": str(exc)[:200]}
            continue
        reduces = [e for e in entries if "all_reduce" in str(e.get("profiling_name", ""))]
        seen[who] = {"exists": True, "entries": len(entries),
                     "last_all_reduce_state": reduces[-1].get("state") if reduces else None}
    return seen


def traces_said(folder: Path, out: Path) -> dict[str, Any]:
    """What `gpucheck hang --traces` makes of gpucheck's dumps (its exit code and
    findings), as a person would run it."""
    from gpucheck.distributed.deadline import OWN_NAME

    report = out / "hang.json"
    argv = [sys.executable, "-m", "gpucheck", "hang", "--traces", str(folder), "--prefix",
            PREFIX + OWN_NAME, "-q", "-o", str(report)]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "error": "gpucheck hang did not end within 120 s"}
    try:
        sections = json.loads(report.read_text())["sections"]
    except (OSError, ValueError, KeyError):
        return {"exit_code": done.returncode, "error": done.stderr.strip()[-300:]}
    return {"exit_code": done.returncode,
            "findings": [(f["check"], f["status"], f.get("subject")) for s in sections
                         for f in s["findings"]]}


def goals(result: dict[str, Any], args: argparse.Namespace) -> dict[str, bool | None]:
    rank_, dump = result["rank"], result["dumps"]["gpucheck"]
    late = rank_["timeout_to_exit_s"]
    state = dump.get("last_all_reduce_state")
    return {"exited_under_timeout_plus_10s": late is not None and late < EXIT_GOAL_S,
            "raised_in_the_rank": bool(rank_["raised"]) and bool(rank_["raised"].get(
                "comm_error")),
            "gpucheck_dump_exists": bool(dump.get("exists")),
            "stuck_op_not_completed": None if args.dry_run else (
                state is not None and state != "completed")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for probe.json and the logs")
    parser.add_argument("--timeout", type=float, default=3.0, help="gpucheck's timeout (s)")
    parser.add_argument("--sleep", type=float, default=10.0,
                        help="how long the op is held back (s)")
    parser.add_argument("--dry-run", action="store_true", help="gloo on CPU, a stand-in op")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        return rank(args)
    out = Path(args.out)
    folder = out / "fr"
    folder.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"dry_run": args.dry_run, "timeout_s": args.timeout,
                              "sleep_s": args.sleep, "rank": run_rank(args, out, folder)}
    result["dumps"] = dumps_seen(folder)
    result["hang_traces"] = traces_said(folder, out)
    result["goals"] = goals(result, args)
    (out / "probe.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({"goals": result["goals"], "rank": result["rank"]}, indent=2,
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
