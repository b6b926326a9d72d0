"""Read ``metrics.json``, the one-JSON-object-per-line log of detectron2's ``JSONWriter`` that
every run writes. A resumed run logs iterations again: the later line wins, key by key. A
malformed line is an error naming the file and line: dropping it would change a curve silently.
"""

from __future__ import annotations

import json

from pretrain.utils.errors import ResultsError

__all__ = ["read_metrics_json"]


def read_metrics_json(path: str) -> list[dict]:
    """One record per iteration, in iteration order. Raises :class:`ResultsError` for an
    unreadable file or a malformed line."""
    by_iter: dict[int, dict] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
            raise ResultsError(f"{path}: line {n} is not an object with an 'iteration'")
        by_iter.setdefault(record["iteration"], {}).update(record)
    return [by_iter[i] for i in sorted(by_iter)]
