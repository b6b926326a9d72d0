"""One live user per directory: an exclusive ``flock`` on a file inside it.

A pretraining run holds ``<OUTPUT_DIR>/.lock``, a study its own. The lock goes with the process
however it ends (``SIGKILL`` included); the file names its last holder for the refusal message.
Forked children drop their inherited copy right after the fork (they may outlive a killed
parent), and in one process the lock is re-entrant (a second trainer on the same directory is
not a second user).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import weakref
from typing import IO

from pretrain.utils.errors import BusyError, LoracError
from pretrain.utils.output_dir import check_output_dir

__all__ = ["LOCK_FILE", "DirLock", "exclusive_dir_lock", "hold_for_lifetime"]

LOCK_FILE = ".lock"

logger = logging.getLogger(__name__)

# Open lock files of this process by real path, with the number of holders. Process-wide on
# purpose: the kernel's lock is per process (per open file), so this table mirrors its state.
_held: dict[str, tuple[IO[str], int]] = {}
_held_guard = threading.Lock()


def _drop_inherited_locks() -> None:
    """In a forked child: drop the inherited lock descriptors, each first pointed at /dev/null
    so that closing it cannot flush or unlock anything of the parent's."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        for f, _ in _held.values():
            os.dup2(devnull, f.fileno())
            f.close()
    finally:
        os.close(devnull)
    _held.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def _holder_text() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class DirLock:
    """An exclusive lock on ``<directory>/<filename>``, also a context manager. :meth:`acquire`
    raises ``error`` naming the directory (``what``) and the holder (a ``user``) when another
    process holds it."""

    def __init__(
        self,
        directory: str,
        what: str = "OUTPUT_DIR",
        user: str = "run",
        filename: str = LOCK_FILE,
        error: type[LoracError] = BusyError,
    ) -> None:
        self.directory, self.what, self.user, self.error = directory, what, user, error
        self.path = os.path.join(directory, filename)
        self._key = ""

    @property
    def held(self) -> bool:
        return bool(self._key)

    def acquire(self) -> DirLock:
        if self._key:
            return self
        check_output_dir(self.directory, self.what)  # a file or read-only: one error line
        os.makedirs(self.directory, exist_ok=True)
        key = os.path.realpath(self.path)
        with _held_guard:
            if key in _held:
                f, count = _held[key]
                _held[key] = (f, count + 1)
                self._key = key
                return self
            f = open(key, "a+")  # noqa: SIM115 - kept open while the lock is held
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                raise self.error(
                    f"{self.what} {self.directory}: another {self.user} is running there "
                    f"({holder}, holds {self.path}); wait for it to end, stop it, or choose "
                    f"another {self.what}"
                ) from None
            except OSError as e:  # ENOLCK, ENOSYS: e.g. Lustre mounted without -o flock
                f.close()
                logger.warning(
                    f"cannot lock {self.path} ({e.strerror}): this file system has no flock; "
                    f"another {self.user} into {self.what} {self.directory} would not be refused"
                )
                return self
            f.seek(0)
            f.truncate()
            f.write(_holder_text() + "\n")
            f.flush()
            _held[key] = (f, 1)
            self._key = key
        return self

    def release(self) -> None:
        with _held_guard:
            key, self._key = self._key, ""
            if not key or key not in _held:
                return
            f, count = _held[key]
            if count > 1:
                _held[key] = (f, count - 1)
                return
            del _held[key]
            f.close()  # the file stays, naming its last holder

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ``with exclusive_dir_lock(out, "--output-dir", "study", ".study.lock", StudyError): ...``:
# a DirLock is taken by ``with`` (this name reads better at the call sites).
exclusive_dir_lock = DirLock


def hold_for_lifetime(owner: object, directory: str, what: str = "OUTPUT_DIR") -> DirLock:
    """Take ``directory``'s lock for as long as ``owner`` lives (it is released when ``owner`` is
    garbage-collected, and by the kernel when the process ends)."""
    lock = DirLock(directory, what).acquire()
    weakref.finalize(owner, lock.release)
    return lock
