"""One progress bar, on rank 0 only, reused for the warm-up and the timed loop."""

from __future__ import annotations

from types import TracebackType
from typing import Any


class Progress:
    """A tqdm bar when `enabled`, else nothing at all (tqdm is not even imported)."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._bar: Any = None

    def __enter__(self) -> Progress:
        if self._enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=0, unit="batch", leave=False, dynamic_ncols=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.close()

    def start(self, phase: str, total: int) -> None:
        if self._bar is not None:
            self._bar.reset(total=total)
            self._bar.set_description(phase)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update()
