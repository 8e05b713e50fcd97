"""PyTorch's own environment report, `python -m torch.utils.collect_env`, verbatim.

PyTorch's bug template asks for it; `gpucheck env --format markdown` (and html) ends
with it in a folded block, so one paste serves the cluster ticket and a PyTorch
issue. It takes seconds (it runs pip, nvidia-smi, lscpu), so the terminal report
never runs it. Run as a child process under a timeout, with this interpreter: a
failure or a hang is a SKIP with its reason, never a crash.
"""

from __future__ import annotations

import subprocess
import sys

from gpucheck.report import Section, skip

COMMAND = (sys.executable, "-m", "torch.utils.collect_env")
TIMEOUT_S = 60.0
MAX_CHARS = 64_000  # a report field, not a log: PyTorch's output is ~5 kB


def collect_env_section(timeout_s: float = TIMEOUT_S,
                        command: tuple[str, ...] = COMMAND) -> Section:
    """`collect_env_output`: what the command printed on stdout (its stderr, warnings
    from runpy, is not part of PyTorch's report), or a SKIP saying why there is none."""
    shown = "python -m torch.utils.collect_env"
    data: dict[str, object] = {"command": shown}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return _skipped(data, f"{shown} did not finish within {timeout_s:g} s")
    except OSError as exc:
        return _skipped(data, f"{shown} could not start: {exc.strerror or exc}")
    output = done.stdout.strip()
    if done.returncode != 0 or not output:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return _skipped(data, f"{shown} exited with status {done.returncode}: {last}")
    data["collect_env_output"] = output[:MAX_CHARS] + "\n"
    return Section("collect_env", "PyTorch's collect_env (for a PyTorch issue)", data)


def _skipped(data: dict[str, object], why: str) -> Section:
    return Section("collect_env", "PyTorch's collect_env (for a PyTorch issue)", data,
                   [skip("env.collect_env", why)])
