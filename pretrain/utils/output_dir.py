"""Whether a run can write its output directory, checked before anything runs.

Every tool creates its output directory late (after reading its data, building its model, or in
a launched worker), where a path that is a file or a directory it may not write ends in an
``OSError`` traceback, sometimes after minutes of work. :func:`check_output_dir` reads only: it
is called where a tool first knows the path (the pretraining launch, :mod:`transfer.run_dir`'s
check, the demo, the study, the report, a submission), and again by
:class:`~pretrain.utils.locks.DirLock` before it creates the directory. It refuses an empty path
and a folder name longer than the filesystem allows (``ENAMETOOLONG`` once written) too, and,
given the tool's ``owner``, a directory holding another tool's run
(:func:`pretrain.utils.run_owner.check_owner`).

Standard library only; ``os.access`` is what decides "writable", so a read-only mount counts as
unwritable for root too.
"""

from __future__ import annotations

import os

from pretrain.utils.errors import ConfigError, LoracError
from pretrain.utils.run_owner import check_owner

__all__ = ["check_output_dir"]


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _check_name_lengths(path: str, where: str, error: type[LoracError]) -> None:
    """Each folder name of ``path`` and the whole path within the limits of the filesystem of
    its nearest existing folder (``pathconf``; 255 and 4096 bytes on Linux)."""
    ancestor = _nearest_existing(path)
    base = ancestor if os.path.isdir(ancestor) else os.path.dirname(ancestor)
    try:
        name_max = os.pathconf(base, "PC_NAME_MAX")
        path_max = os.pathconf(base, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for name in os.path.abspath(path).split(os.sep):
        size = len(os.fsencode(name))
        if size > name_max:
            raise error(
                f"{where[:80]}...: the folder name {name[:24]}... is {size} bytes long, over "
                f"this filesystem's limit of {name_max}; choose a shorter name"
            )
    size = len(os.fsencode(os.path.abspath(path)))
    if size >= path_max:
        raise error(
            f"{where[:80]}...: the path is {size} bytes long, over this filesystem's limit of "
            f"{path_max}; choose a shorter path"
        )


def check_output_dir(
    path: str,
    what: str = "OUTPUT_DIR",
    error: type[LoracError] = ConfigError,
    *,
    owner: str = "",
    optional: bool = False,
) -> None:
    """Raise ``error`` (one line naming ``what`` and ``path``) unless ``path`` is a directory
    this process can write, or one it can create (its nearest existing ancestor is a writable
    directory), with names the filesystem allows; and, given ``owner`` (a kind of
    :data:`~pretrain.utils.run_owner.KINDS`), not another tool's run directory. An empty ``path``
    is refused unless ``optional`` (the caller then writes elsewhere). Creates nothing."""
    if not path:
        if optional:
            return
        raise error(f"{what} is empty: name the directory to write to")
    where = f"{what} {path}"
    _check_name_lengths(path, where, error)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise error(f"{where} is a file, not a directory; choose a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise error(f"{where} is not writable; choose a directory you can write")
        if owner:
            check_owner(path, owner, what, error)
        return
    ancestor = _nearest_existing(path)
    if not os.path.isdir(ancestor):
        raise error(f"{where} cannot be created: {ancestor} is not a directory; choose a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise error(
            f"{where} cannot be created: {ancestor} is not writable; choose a directory you can "
            "write"
        )
