"""What a rank has done so far (its step, rank 0's partial results, the survivors'
diagnoses, caught library warnings), kept on its context and in the run directory the
launching process reads after a failure; and what the terminal shows meanwhile
(docs/hang.md, "The rank frame"; docs/DESIGN.md)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpucheck.context import Console, Progress, RunContext
from gpucheck.errors import UsageError
from gpucheck.escape import terminal as shown
from gpucheck.inputs import parse_json, read_capped
from gpucheck.output import check_folder, write_atomic

PARTIAL_FILE = "partial.json"
ROSTER_FILE = "roster.json"
DIAGNOSIS_GLOB = "diagnosis-*.json"
RANK_FILE = "rank-{rank}.json"
RANK_GLOB = "rank-*.json"
WARNINGS_FILE = "warnings-{rank}.json"
WARNINGS_GLOB = "warnings-*.json"
MAX_KEPT = 20  # distinct warnings; a flood is cut, not kept whole
MAX_TEXT = 300

Rows = list[dict[str, Any]]


def run_dir(ctx: RunContext) -> Path | None:
    """The run directory the launching process (or GPUCHECK_RUN_DIR) gave this rank."""
    raw = ctx.options.run_dir
    return Path(raw) if raw else None


def checked_run_dir(path: str | None, option: str) -> None:
    """The user's run directory, made (0700) when missing; UsageError unless it is a
    directory of this user's alone, on a path no other user can change."""
    if path is None:
        return
    check_folder(path.rstrip("/") or "/", option)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(f"{option}={path}: cannot create it ({exc.strerror}); choose "
                         "another directory") from None
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or mode & 0o022:
        raise UsageError(f"{option}={path}: not a directory of this user's alone (a link, "
                         f"uid {info.st_uid}, mode {mode:o}): give a directory only this "
                         "user may write, never a shared one like /tmp")


def set_step(ctx: RunContext, label: str | None) -> None:
    """Name what this rank is doing now (`all_reduce 4 MiB`); failures quote it."""
    ctx.progress.step = label


def _write_json(ctx: RunContext, name: str, data: Any) -> None:
    folder = run_dir(ctx)
    if folder is not None:
        write_atomic(str(folder / name), json.dumps(data), "run directory", sync=False)


def publish_partial(ctx: RunContext, data: dict[str, Any]) -> None:
    """Keep what the reporting rank has measured so far (replaces the previous copy)."""
    ctx.progress.partial = data
    _write_json(ctx, PARTIAL_FILE, data)


def remember_partial(ctx: RunContext, data: dict[str, Any] | None) -> None:
    """Keep partial results in this process only (the launcher, after Ctrl-C)."""
    ctx.progress.partial = data


def publish_roster(ctx: RunContext, roster: list[dict[str, Any]]) -> None:
    _write_json(ctx, ROSTER_FILE, roster)


def record_diagnosis(ctx: RunContext, diagnosis: dict[str, Any]) -> None:
    """A surviving rank's view of a failure: who did not answer, during which step."""
    ctx.progress.diagnoses.append(diagnosis)
    _write_json(ctx, f"diagnosis-{diagnosis['rank']}.json", diagnosis)


def publish_rank(ctx: RunContext, rank: int, data: dict[str, Any]) -> None:
    """Keep THIS rank's figures so far in a file of its own: a stuck or killed rank
    costs only its own newest figures, and rank 0 never waits on another rank."""
    ctx.progress.ranks[rank] = data
    _write_json(ctx, RANK_FILE.format(rank=rank), data)


def local_ranks(ctx: RunContext) -> dict[int, dict[str, Any]]:
    """Every rank's figures known here: this process's, and the run directory's."""
    folder = run_dir(ctx)
    found = read_ranks(folder) if folder is not None and folder.is_dir() else {}
    return found | ctx.progress.ranks


def read_ranks(folder: Path) -> dict[int, dict[str, Any]]:
    """{rank: figures} from the rank files in `folder`."""
    found = {}
    for path in sorted(folder.glob(RANK_GLOB)):
        data = _read(path)
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            found[data["rank"]] = data
    return found


def local_partial(ctx: RunContext) -> dict[str, Any] | None:
    return ctx.progress.partial


def reset(ctx: RunContext) -> None:
    """Start a new job's record in place: the contexts `RunContext.scoped` made share it."""
    fresh = Progress()
    record = ctx.progress
    record.step, record.partial = fresh.step, fresh.partial
    record.diagnoses, record.ranks = fresh.diagnoses, fresh.ranks


def _read(path: Path) -> Any:
    """A file the ranks left, or None: regular, not a link, within the report cap."""
    try:
        return parse_json(read_capped(str(path), follow=False))
    except (OSError, ValueError, RecursionError):
        return None


def read_run_dir(folder: Path) -> tuple[dict[str, Any] | None, list[Any] | None,
                                        list[dict[str, Any]]]:
    """(partial results, roster, diagnoses) that the ranks left in `folder`."""
    diagnoses = [d for p in sorted(folder.glob(DIAGNOSIS_GLOB)) if (d := _read(p))]
    return _read(folder / PARTIAL_FILE), _read(folder / ROSTER_FILE), diagnoses


# --- library warnings: into the report, not stderr ---------------------------------

@contextmanager
def caught(rank: int, kept: Rows, folder: Path | None) -> Iterator[None]:
    """Record every warning raised in the block (once per place), keep it for the
    report and publish it in the run directory `folder` for the launcher."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            rows = []
            for w in seen:
                text = str(w.message).strip().splitlines()
                rows.append({"category": w.category.__name__,
                             "message": (text[0] if text else "")[:MAX_TEXT],
                             "where": f"{Path(w.filename).name}:{w.lineno}", "ranks": [rank]})
            remember(kept, rows)
            if folder is not None and rows:
                # The log is a courtesy: a full disk must not fail the rank.
                with contextlib.suppress(UsageError):  # WriteError, or an unsafe folder
                    write_atomic(str(folder / WARNINGS_FILE.format(rank=rank)),
                                 json.dumps(rows), "the run directory", sync=False)


def gather(folder: Path, kept: Rows) -> None:
    """The warnings every rank left in the run directory `folder`, kept for the report."""
    for path in sorted(folder.glob(WARNINGS_GLOB)):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rows, list):
            remember(kept, [r for r in rows if isinstance(r, dict)])


def remember(kept: Rows, rows: Rows) -> None:
    """Merge `rows` into the `kept` ones: one row per (category, message, where)."""
    for row in rows:
        key = (row.get("category"), row.get("message"), row.get("where"))
        same = next((k for k in kept if (k["category"], k["message"], k["where"]) == key),
                    None)
        if same is not None:
            same["ranks"] = sorted({*same["ranks"], *row.get("ranks", [])})
        elif len(kept) < MAX_KEPT:
            kept.append({"category": str(key[0]), "message": str(key[1]),
                         "where": str(key[2]), "ranks": list(row.get("ranks", []))})


def log_rows(kept: Rows) -> Rows:
    """Everything caught since the last call, then forgotten (`all`: once per run)."""
    rows = list(kept)
    kept.clear()
    return rows


# --- the terminal: a line per step and a tqdm bar, on stderr, rank 0 only ----------

def enabled(ctx: RunContext) -> bool:
    """Progress is on (a terminal, no --quiet) and this process reports: the launcher,
    a rank alone, or rank 0 of a job torchrun or srun launched."""
    if not ctx.options.show_progress:
        return False
    from gpucheck.distributed.world import reports

    try:
        return reports(ctx)
    except UsageError:
        return False  # the command itself says what is wrong with the environment


def say(ctx: RunContext, text: str) -> None:
    """One line of progress (above any open bar)."""
    if not enabled(ctx):
        return
    text = shown(text)  # a step can name a host or a file: shown, never obeyed
    if not (ctx.bars and ctx.bars[-1].write_above(text)):
        print(text, file=ctx.console.stderr, flush=True)


def bar_step(ctx: RunContext, text: str) -> None:
    """Name what the innermost open bar is doing now (`gemm bf16 8192^3`)."""
    if ctx.bars:
        ctx.bars[-1].describe(text)


class Bar:
    """A tqdm bar `label: what it does now`; inert without a console (tqdm unimported)."""

    def __init__(self, label: str, total: int | None, unit: str,
                 console: Console | None) -> None:
        self.label = label
        self.tqdm: Any = None
        self.stderr = console.stderr if console else None
        if console is not None:
            from tqdm import tqdm

            # A bare pseudo-terminal reports 0 columns: 80 instead of an empty bar.
            fixed = None if console.columns(console.stderr) else 80
            self.tqdm = tqdm(total=total, unit=unit, leave=False, file=console.stderr,
                             desc=label, ncols=fixed, dynamic_ncols=fixed is None)

    def write_above(self, text: str) -> bool:
        """A line above the bar; False when the bar is inert."""
        if self.tqdm is not None:
            self.tqdm.write(text, file=self.stderr)
        return self.tqdm is not None

    def describe(self, text: str) -> None:
        if self.tqdm is not None:
            self.tqdm.set_description(f"{self.label}: {text}")

    def restart(self, text: str, total: int | None) -> None:
        """Count again from zero, for a new phase (bench's warm-up, then timed loop)."""
        if self.tqdm is not None:
            self.tqdm.reset(total=total)
            self.describe(text)

    def advance(self, count: int = 1) -> None:
        if self.tqdm is not None:
            self.tqdm.update(count)

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None


@contextmanager
def bar(ctx: RunContext, label: str, total: int | None = None,
        unit: str = "it") -> Iterator[Bar]:
    """An open bar for the block; `bar_step` names its current step."""
    opened = Bar(label, total, unit, ctx.console if enabled(ctx) else None)
    ctx.bars.append(opened)
    try:
        yield opened
    finally:
        ctx.bars.remove(opened)
        opened.close()


@contextmanager
def timed(ctx: RunContext, label: str, seconds: float, tick_s: float = 1.0) -> Iterator[Bar]:
    """A bar of `seconds` that counts the block's own seconds (a burn-in is one long
    call: the bar, ETA included, would stand still), full at most (it may run over)."""
    with bar(ctx, label, max(1, round(seconds)), "s") as opened:
        if opened.tqdm is None:
            yield opened
            return
        done = threading.Event()

        def tick() -> None:
            while not done.wait(tick_s):
                now = opened.tqdm
                if now is None or now.n >= now.total:
                    return
                now.update(1)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield opened
        finally:
            done.set()
            ticker.join(timeout=5 * tick_s)
