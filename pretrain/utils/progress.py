"""Progress bars that suit where they print: tqdm's live bar on a terminal; elsewhere (a log file,
a SLURM ``.out``, a pipe) one short line at each tenth of the work or each minute, whichever comes
first, and one at the end.

Written here because tqdm has no such mode: to a file it writes each redraw after a ``\\r`` with
no newline, so a log holds one line of thousands of characters (``mininterval`` only spaces the
redraws). Every tool's progress goes through :func:`progress`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm import tqdm

__all__ = ["LineProgress", "progress"]

MAX_LINE = 120  # characters of a line in a non-terminal log


class LineProgress:
    """tqdm's ``update``/iteration/context-manager face, printing whole short lines: at each
    ``step`` fraction of ``total`` (or every ``interval`` seconds without a total, or when
    ``interval`` seconds passed since the last line) and at the end."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        desc: str | None = None,
        total: int | None = None,
        unit: str = "it",
        file: IO[str] | None = None,
        step: float = 0.1,
        interval: float = 60.0,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.desc, self.total, self.unit = iterable, desc or "progress", total, unit
        self.file, self.step, self.interval = file, step, interval
        self.n, self._start = 0, time.monotonic()
        self._last_time, self._last_tick, self._closed = self._start, 0, False
        self._ticks = max(1, round(1 / step))

    def _print(self) -> None:
        seconds = time.monotonic() - self._start
        rate = self.n / seconds if seconds > 0 else 0.0
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f"{100 * self.n / self.total:3.0f}% " if self.total else ""
        desc = self.desc if len(self.desc) <= 60 else self.desc[:57] + "..."
        line = f"{desc}: {pct}({done} {self.unit}, {seconds:.0f} s, {rate:.3g} {self.unit}/s)"
        print(line[:MAX_LINE], file=self.file or sys.stderr, flush=True)
        self._last_time = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        tick = int(self.n * self._ticks // self.total) if self.total else 0  # whole steps done
        if tick > self._last_tick and self.n < self.total:
            self._last_tick = tick
            self._print()
        elif now - self._last_time >= self.interval:
            self._print()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._print()

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("LineProgress without an iterable: use update()")
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    iterable: Iterable | None = None,
    *,
    desc: str | None = None,
    total: int | None = None,
    unit: str = "it",
    disable: bool = False,
    file: IO[str] | None = None,
) -> Any:
    """A progress bar over ``iterable`` (or one to ``update``): tqdm's on a terminal,
    :class:`LineProgress` otherwise; ``disable`` gives the iterable back untouched."""
    out = file or sys.stderr
    if disable:
        return iterable if iterable is not None else LineProgress(total=0, file=_Null())
    if out.isatty():
        return tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True, file=out)
    return LineProgress(iterable, desc=desc, total=total, unit=unit, file=out)


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
