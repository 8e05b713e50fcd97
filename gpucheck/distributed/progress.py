"""What a rank has done so far (its step, the reporting rank's partial results, the
survivors' diagnoses) and the library warnings it caught, kept on its context and, with
a run directory, in files the launching process reads after a failure (docs/hang.md,
"The rank frame")."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpucheck.context import Progress, RunContext
from gpucheck.errors import UsageError
from gpucheck.inputs import parse_json, read_capped
from gpucheck.output import check_folder, write_atomic

PARTIAL_FILE = "partial.json"
ROSTER_FILE = "roster.json"
DIAGNOSIS_GLOB = "diagnosis-*.json"
RANK_FILE = "rank-{rank}.json"
RANK_GLOB = "rank-*.json"


def run_dir(ctx: RunContext) -> Path | None:
    """The run directory: the one the launching process gave this rank, else the one
    the user named (GPUCHECK_RUN_DIR, e.g. under torchrun or srun), else None."""
    raw = ctx.options.run_dir
    return Path(raw) if raw else None


def checked_run_dir(path: str | None, option: str) -> None:
    """The user's run directory, made (0700) when missing; UsageError (exit 2) unless it
    is a directory of this user's that no other user may write, on a path no other
    user can change (`gpucheck.output.check_folder`)."""
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


def current_step(ctx: RunContext) -> str | None:
    return ctx.progress.step


def _write_json(ctx: RunContext, name: str, data: Any) -> None:
    folder = run_dir(ctx)
    if folder is None:
        return
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
    """Keep what THIS rank has measured so far, apart from rank 0's partial results: each
    rank writes its own file, so a stuck or killed rank costs only its own newest
    figures, and rank 0 never waits on another rank to keep them."""
    ctx.progress.ranks[rank] = data
    _write_json(ctx, RANK_FILE.format(rank=rank), data)


def remember_ranks(ctx: RunContext, ranks: dict[int, dict[str, Any]]) -> None:
    """Keep every rank's published figures in this process (the launcher, after Ctrl-C)."""
    ctx.progress.ranks = dict(ranks)


def local_ranks(ctx: RunContext) -> dict[int, dict[str, Any]]:
    """Every rank's figures known here: this process's, and the run directory's when
    there is one (ranks on this node, under torchrun or srun with GPUCHECK_RUN_DIR)."""
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


def local_diagnoses(ctx: RunContext) -> list[dict[str, Any]]:
    return list(ctx.progress.diagnoses)


def reset(ctx: RunContext) -> None:
    """Start a new job's record in this process (the run directory stays). In place:
    the contexts `RunContext.scoped` made share it."""
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


WARNINGS_FILE = "warnings-{rank}.json"
WARNINGS_GLOB = "warnings-*.json"
MAX_KEPT = 20  # distinct warnings; a flood is cut, not kept whole
MAX_TEXT = 300

Rows = list[dict[str, Any]]


@contextmanager
def caught(rank: int, kept: Rows, folder: Path | None) -> Iterator[None]:
    """Record every warning raised in the block (once per place, as Python's default
    filter shows it), keep it for the report, publish it for the launcher in the run
    directory `folder` (when the job has one)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            rows = [_row(w, rank) for w in seen]
            remember(kept, rows)
            _publish(folder, rank, rows)


def _row(warning: warnings.WarningMessage, rank: int) -> dict[str, Any]:
    text = str(warning.message).strip().splitlines()
    return {"category": warning.category.__name__,
            "message": (text[0] if text else "")[:MAX_TEXT],
            "where": f"{Path(warning.filename).name}:{warning.lineno}", "ranks": [rank]}


def _publish(folder: Path | None, rank: int, rows: list[dict[str, Any]]) -> None:
    if folder is None or not rows:
        return
    # The log is a courtesy: a full disk must not fail the rank.
    with contextlib.suppress(UsageError):  # WriteError, or an unsafe folder
        write_atomic(str(folder / WARNINGS_FILE.format(rank=rank)), json.dumps(rows),
                     "the run directory", sync=False)


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
    """Everything caught since the last call, then forgotten (`all` runs several
    commands in one process: its report gets them all once)."""
    rows = list(kept)
    kept.clear()
    return rows
