"""A checkpointer whose files are always complete, loaded without running pickled code.

Writes are atomic renames of fsync'ed temporary files, and ``last_checkpoint`` points at them only
then: a kill at any instant leaves the previous checkpoint loadable. Loads use
``torch.load(weights_only=True)``. An unreadable checkpoint is a user error naming the file and
how to go on, found by :func:`check_last_checkpoint` before a resumed run writes anything.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from typing import Any

import torch
from detectron2.engine import hooks
from fvcore.common.checkpoint import Checkpointer

from pretrain.engine.config_changes import CHANGES_FILE
from pretrain.utils.atomic_io import atomic_replace, atomic_write_bytes
from pretrain.utils.checkpoint_fit import StrictShapes
from pretrain.utils.errors import CheckpointError
from pretrain.utils.torch_files import incomplete_torch_file

__all__ = [
    "AtomicCheckpointer",
    "KeepRecentCheckpoints",
    "check_last_checkpoint",
    "periodic_checkpoints",
]

LAST_CHECKPOINT = "last_checkpoint"  # fvcore's pointer file: the name of the checkpoint to resume
_PERIODIC = re.compile(r"model_(\d{7})\.pth")  # fvcore's periodic names (and a stop's)


def _what_to_do(directory: str, unreadable: str) -> str:
    """How to go on from an unreadable checkpoint of the run in ``directory``."""
    others = sorted(
        f for f in os.listdir(directory) if f.endswith(".pth") and f != os.path.basename(unreadable)
    )
    earlier = f" (there: {', '.join(others)})" if others else ""
    pointer = os.path.join(directory, LAST_CHECKPOINT)
    return (
        f"to resume from an earlier checkpoint, write its file name into {pointer}{earlier}; to "
        "start afresh, choose another OUTPUT_DIR"
    )


def check_last_checkpoint(directory: str) -> None:
    """Raise :class:`CheckpointError` when ``directory/last_checkpoint`` names a checkpoint that
    is missing or incomplete (:func:`~pretrain.utils.torch_files.incomplete_torch_file`); reads
    the pointer and the file's ends only."""
    pointer = os.path.join(directory, LAST_CHECKPOINT)
    if not os.path.isfile(pointer):
        return
    with open(pointer) as f:
        path = os.path.join(directory, f.read().strip())
    problem = "is missing" if not os.path.isfile(path) else incomplete_torch_file(path)
    if problem:
        problem = problem if problem == "is missing" else f"is {problem}"
        raise CheckpointError(
            f"{path}, the checkpoint {pointer} names, {problem}: {_what_to_do(directory, path)}"
        )


class AtomicCheckpointer(StrictShapes, Checkpointer):
    """fvcore ``Checkpointer`` with atomic saves and ``weights_only`` loads (local paths); a
    tensor that does not fit the model is an error (:class:`StrictShapes`)."""

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
        atomic_replace(path, lambda f: torch.save(data, f))
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write_bytes(
            os.path.join(self.save_dir, "last_checkpoint"), last_filename_basename.encode()
        )

    def _load_file(self, f: str) -> dict[str, Any]:  # fvcore's documented override point
        try:
            return torch.load(f, map_location=torch.device("cpu"), weights_only=True)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as e:  # unreadable
            why = incomplete_torch_file(f) or " ".join(str(e).split())[:200]
            raise CheckpointError(
                f"{f}: not a readable checkpoint ({why}): "
                f"{_what_to_do(os.path.dirname(f) or '.', f)}"
            ) from None


def periodic_checkpoints(directory: str) -> list[str]:
    """Paths of the ``model_<iteration>.pth`` files in ``directory``, oldest iteration first
    (the periodic checkpoints and those a stop on a signal saved); not ``model_final``, nor a
    finished run's final checkpoint kept under such a name when the run was extended
    (``previous_final`` in ``config_changes.json``, :mod:`pretrain.engine.config_changes`)."""
    if not os.path.isdir(directory):
        return []
    kept = set()
    changes = os.path.join(directory, CHANGES_FILE)
    if os.path.isfile(changes):
        with open(changes, encoding="utf-8") as f:
            records = json.load(f)
        kept = {
            r["previous_final"] for r in records if isinstance(r, dict) and "previous_final" in r
        }
    found = sorted(
        (int(m[1]), f)
        for f in os.listdir(directory)
        if (m := _PERIODIC.fullmatch(f)) and f not in kept
    )
    return [os.path.join(directory, f) for _, f in found]


class KeepRecentCheckpoints(hooks.PeriodicCheckpointer):
    """detectron2's periodic checkpointer hook keeping at most ``max_to_keep`` periodic
    checkpoints over the whole run, resumes included (0: keep them all).

    fvcore counts only the files its own process saved, so each resume would leave up to
    ``max_to_keep`` more behind; here the count starts from the files on disk. The checkpoint
    ``last_checkpoint`` names is never deleted.
    """

    def __init__(
        self, checkpointer: Checkpointer, period: int, max_iter: int, max_to_keep: int
    ) -> None:
        super().__init__(checkpointer, period, max_iter, max_to_keep=max_to_keep or None)

    def before_train(self) -> None:
        super().before_train()
        if self.max_to_keep:
            self.recent_checkpoints = periodic_checkpoints(self.checkpointer.save_dir)
            self._prune()

    def step(self, iteration: int, **kwargs: Any) -> None:
        super().step(iteration, **kwargs)
        if self.max_to_keep:
            self._prune()

    def _prune(self) -> None:
        pointer = os.path.join(self.checkpointer.save_dir, LAST_CHECKPOINT)
        keep = ""
        if os.path.isfile(pointer):
            with open(pointer) as f:
                keep = os.path.join(self.checkpointer.save_dir, f.read().strip())
        while len(self.recent_checkpoints) > self.max_to_keep:
            path = self.recent_checkpoints.pop(0)
            if path != keep and os.path.isfile(path):
                os.unlink(path)
