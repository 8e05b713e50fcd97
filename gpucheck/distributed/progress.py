"""What a rank has done so far, kept where a failure cannot take it away.

Workers call `set_step` before each phase (so a failure says where it happened) and
`publish_partial` on the reporting rank whenever a result is complete. Under
self-launch the job has a run directory (made by `run_job`, or `GPUCHECK_RUN_DIR` set
by the user to keep it; the ranks get it in their `RunOptions`, `use_run_dir`):
partial results, the roster from the check-in and each survivor's diagnosis are
written there atomically, so the launching process can still report them after the
agent has stopped every worker. Without a run directory they
stay in this process, for the reporting rank under torchrun or srun.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

RUN_DIR_VAR = "GPUCHECK_RUN_DIR"
PARTIAL_FILE = "partial.json"
ROSTER_FILE = "roster.json"
DIAGNOSIS_GLOB = "diagnosis-*.json"
RANK_FILE = "rank-{rank}.json"
RANK_GLOB = "rank-*.json"

_state: dict[str, Any] = {"step": None, "partial": None, "diagnoses": [], "ranks": {},
                          "run_dir": None}


def use_run_dir(folder: str | None) -> None:
    """This rank's run directory, from its RunOptions (a rank gpucheck started)."""
    _state["run_dir"] = folder


def run_dir() -> Path | None:
    """The run directory: the one the launching process gave this rank, else the one
    the user named (`GPUCHECK_RUN_DIR`, e.g. under torchrun or srun), else None."""
    raw = _state["run_dir"] or os.environ.get(RUN_DIR_VAR)
    return Path(raw) if raw else None


def set_step(label: str | None) -> None:
    """Name what this rank is doing now (`all_reduce 4 MiB`); failures quote it."""
    _state["step"] = label


def current_step() -> str | None:
    step: str | None = _state["step"]
    return step


def _write_json(name: str, data: Any) -> None:
    folder = run_dir()
    if folder is None:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, folder / name)


def publish_partial(data: dict[str, Any]) -> None:
    """Keep what the reporting rank has measured so far (replaces the previous copy)."""
    _state["partial"] = data
    _write_json(PARTIAL_FILE, data)


def remember_partial(data: dict[str, Any] | None) -> None:
    """Keep partial results in this process only (the launcher, after Ctrl-C)."""
    _state["partial"] = data


def publish_roster(roster: list[dict[str, Any]]) -> None:
    _write_json(ROSTER_FILE, roster)


def record_diagnosis(diagnosis: dict[str, Any]) -> None:
    """A surviving rank's view of a failure: who did not answer, during which step."""
    _state["diagnoses"].append(diagnosis)
    _write_json(f"diagnosis-{diagnosis['rank']}.json", diagnosis)


def publish_rank(rank: int, data: dict[str, Any]) -> None:
    """Keep what THIS rank has measured so far, apart from rank 0's partial results: each
    rank writes its own file, so a stuck or killed rank costs only its own newest
    figures, and rank 0 never waits on another rank to keep them."""
    _state["ranks"][rank] = data
    _write_json(RANK_FILE.format(rank=rank), data)


def remember_ranks(ranks: dict[int, dict[str, Any]]) -> None:
    """Keep every rank's published figures in this process (the launcher, after Ctrl-C)."""
    _state["ranks"] = dict(ranks)


def local_ranks() -> dict[int, dict[str, Any]]:
    """Every rank's figures known here: this process's, and the run directory's when
    there is one (ranks on this node, under torchrun or srun with GPUCHECK_RUN_DIR)."""
    folder = run_dir()
    found = read_ranks(folder) if folder is not None and folder.is_dir() else {}
    mine: dict[int, dict[str, Any]] = _state["ranks"]
    return found | mine


def read_ranks(folder: Path) -> dict[int, dict[str, Any]]:
    """{rank: figures} from the rank files in `folder`."""
    found = {}
    for path in sorted(folder.glob(RANK_GLOB)):
        data = _read(path)
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            found[data["rank"]] = data
    return found


def local_partial() -> dict[str, Any] | None:
    partial: dict[str, Any] | None = _state["partial"]
    return partial


def local_diagnoses() -> list[dict[str, Any]]:
    return list(_state["diagnoses"])


def reset() -> None:
    _state.update(step=None, partial=None, diagnoses=[], ranks={})


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_run_dir(folder: Path) -> tuple[dict[str, Any] | None, list[Any] | None,
                                        list[dict[str, Any]]]:
    """(partial results, roster, diagnoses) that the ranks left in `folder`."""
    diagnoses = [d for p in sorted(folder.glob(DIAGNOSIS_GLOB)) if (d := _read(p))]
    return _read(folder / PARTIAL_FILE), _read(folder / ROSTER_FILE), diagnoses
