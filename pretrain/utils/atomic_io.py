"""Files that are complete or absent: write to a temporary file in the same folder, fsync,
rename over the target, fsync the folder. A kill at any instant leaves the old file or the new
one. Temporary files are created as ``open()`` creates files (``0o666`` less the umask, not
``mkstemp``'s ``0o600``), so results on a shared file system stay readable by others.

The bottom layer: checkpoints (:mod:`pretrain.engine.checkpoint`), run information
(:mod:`pretrain.utils.run_setup`), the study's records and the feature cache all write through it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["atomic_replace", "atomic_write_bytes"]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(folder: str, prefix: str) -> tuple[int, str]:
    """A new file ``folder/<prefix><random>``, created as ``open()`` creates files.

    ``tempfile.mkstemp`` would give mode 0o600 whatever the umask; ``os.open`` with 0o666 lets
    the kernel apply the umask (and a directory's default ACL) exactly as for any other file.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(folder, prefix + secrets.token_hex(6))
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free temporary name starting with {prefix!r}")


def atomic_replace(final: str, write: Callable[[BinaryIO], object]) -> None:
    """Create ``final`` through ``write(file)`` on a temporary file of the same folder, fsync'ed
    and renamed over it: readers see the old or the new file, never a part."""
    folder = os.path.dirname(os.path.abspath(final))
    fd, tmp = _create_temporary(folder, ".tmp-" + os.path.basename(final) + "-")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(folder)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new content, never a mix."""
    atomic_replace(path, lambda f: f.write(data))
