"""Shared benchmark helpers: interleaved timings (machine noise hits all candidates alike) and
the JSON report."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def interleaved_timings(
    fns: dict[str, Callable[[], object]], repeats: int = 10, inner: int = 5, warmup: int = 3
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin in one process."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def report_json(result: dict, path: str | None) -> None:
    """Print ``result`` as JSON and, with ``path``, also write it there (parents created)."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
