"""Whether a run can write its output directory, checked before anything runs.

Every tool creates its output directory late (after reading its data, building its model, or in
a launched worker), where a path that is a file or a directory it may not write ends in an
``OSError`` traceback, sometimes after minutes of work. :func:`check_output_dir` reads only: it
is called where a tool first knows the path (the pretraining launch, :mod:`transfer.run_dir`'s
check, the demo, the study, the report, a submission), and again by
:class:`~pretrain.utils.locks.DirLock` before it creates the directory.

Standard library only; ``os.access`` is what decides "writable", so a read-only mount counts as
unwritable for root too.
"""

from __future__ import annotations

import os

from pretrain.utils.errors import ConfigError, LoracError

__all__ = ["check_output_dir"]


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def check_output_dir(
    path: str, what: str = "OUTPUT_DIR", error: type[LoracError] = ConfigError
) -> None:
    """Raise ``error`` (one line naming ``what`` and ``path``) unless ``path`` is a directory
    this process can write, or one it can create (its nearest existing ancestor is a writable
    directory). An empty ``path`` is left to the caller. Creates nothing."""
    if not path:
        return
    where = f"{what} {path}"
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise error(f"{where} is a file, not a directory; choose a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise error(f"{where} is not writable; choose a directory you can write")
        return
    ancestor = _nearest_existing(path)
    if not os.path.isdir(ancestor):
        raise error(f"{where} cannot be created: {ancestor} is not a directory; choose a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise error(
            f"{where} cannot be created: {ancestor} is not writable; choose a directory you can "
            "write"
        )
