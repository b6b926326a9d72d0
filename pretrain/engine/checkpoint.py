"""A checkpointer whose files are always complete, loaded without running pickled code.

Writes go to a temporary file in the same directory, are fsync'ed and atomically renamed, and only
then does ``last_checkpoint`` (itself replaced atomically) point at them: a kill at any instant
leaves the previous checkpoint loadable and the pointer valid. The files get the permissions a
plain ``open(path, "w")`` would give (``0o666`` less the umask), not ``mkstemp``'s private
``0o600``: on a shared file system other users must be able to read ``model_final.pth``. Loads
use ``torch.load(weights_only=True)``; everything in a checkpoint besides tensors is plain types.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any, BinaryIO

import torch
from fvcore.common.checkpoint import Checkpointer

__all__ = ["AtomicCheckpointer", "atomic_write_bytes"]


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


def _atomic_replace(final: str, write: Callable[[BinaryIO], object]) -> None:
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
    _atomic_replace(path, lambda f: f.write(data))


class AtomicCheckpointer(Checkpointer):
    """fvcore ``Checkpointer`` with atomic saves and ``weights_only`` loads (local paths)."""

    def remove_stale_temporaries(self) -> list[str]:
        """Delete ``.tmp-*`` files a kill left mid-write (each would leak a checkpoint's size)."""
        if not self.save_dir or not os.path.isdir(self.save_dir):
            return []
        stale = [f for f in os.listdir(self.save_dir) if f.startswith(".tmp-")]
        for name in stale:
            os.unlink(os.path.join(self.save_dir, name))
        return stale

    def save(self, name: str, **kwargs: Any) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data: dict[str, Any] = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        os.makedirs(self.save_dir, exist_ok=True)
        basename = f"{name}.pth"
        path = os.path.join(self.save_dir, basename)
        self.logger.info(f"Saving checkpoint to {path}")
        _atomic_replace(path, lambda f: torch.save(data, f))
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write_bytes(
            os.path.join(self.save_dir, "last_checkpoint"), last_filename_basename.encode()
        )

    def _load_file(self, f: str) -> dict[str, Any]:  # fvcore's documented override point
        return torch.load(f, map_location=torch.device("cpu"), weights_only=True)
