"""CUDA's own word on host syncs: a short run with ``torch.cuda.set_sync_debug_mode``.

:mod:`pretrain.diagnostics.step_count` counts on the CPU what a GPU would synchronise on; this
asks a GPU. :func:`report` trains a config for a few iterations (small generated images, the
config's model, views, loss and optimiser) with CUDA's sync detector on in every iteration that
neither logs nor checkpoints, so that each synchronising call (a value read, a blocking copy, an
op whose kernel waits) is reported with the Python line it came from.
``benchmarks/cuda_sync_report.py`` prints it for the shipped configs.
"""

from __future__ import annotations

import collections
import tempfile
import threading
import traceback
import warnings
from pathlib import Path

import torch
from detectron2.engine import HookBase

from pretrain.config import load_config
from pretrain.diagnostics.op_counter import ROOT, innermost_frame, short_path
from pretrain.diagnostics.step_count import toy_opts
from pretrain.engine.trainer import PretrainTrainer

__all__ = ["SyncDebug", "report"]

_THIS = "/diagnostics/cuda_syncs.py"


class SyncDebug(HookBase):
    """CUDA's sync detector (``mode``) on the iterations that neither log nor checkpoint, from
    iteration ``first`` on.

    Each synchronising call is kept with its thread and Python stack, and charged to the
    innermost frame of this project (``where``): a sync in torch's own Python is charged to the
    project line that called it. The hook makes no CUDA call of its own in or around a checked
    window, so every sync it reports is the step's.
    """

    def __init__(self, mode: str = "warn", first: int = 2) -> None:
        self.mode, self.first = mode, first
        self.checked = 0
        self.syncs: list[dict] = []
        self._previous = None

    def before_step(self) -> None:
        flush_due = getattr(self.trainer, "_flush_due", lambda: False)()
        if self.trainer.iter >= self.first and not flush_due:
            self._previous = warnings.showwarning
            warnings.showwarning = self.showwarning
            torch.cuda.set_sync_debug_mode(self.mode)
            self.checked += 1

    def after_step(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if self._previous is not None:
            warnings.showwarning, self._previous = self._previous, None

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        """``warnings.showwarning`` in a checked window: keeps CUDA's sync warnings only."""
        if "synchroniz" not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        self.syncs.append(
            {
                "iteration": self.trainer.iter,
                "thread": threading.current_thread().name,
                "origin": f"{short_path(filename)}:{lineno}",
                "where": innermost_frame(
                    ((f.filename, f.lineno, f.name) for f in reversed(stack)), (_THIS,)
                )
                or f"{short_path(filename)}:{lineno}",
                "stack": [f"{short_path(f.filename)}:{f.lineno} ({f.name})" for f in stack[-12:]],
            }
        )


def report(config: str, extra: list[str] | None = None, iters: int = 8) -> dict:
    """Syncs per checked iteration, by source line, of ``config`` (relative to the checkout)
    trained ``iters`` steps on CUDA; ``extra``: more KEY VALUE overrides."""
    with tempfile.TemporaryDirectory() as tmp:
        keys = {"MODEL.DEVICE": "cuda", "MODEL.QUEUE_SIZE": 64, "SOLVER.IMS_PER_BATCH": 8,
                "INPUT.LARGE_SIZE": 64, "INPUT.SMALL_SIZE": 32, "SOLVER.MAX_ITER": iters,
                "SOLVER.LOG_PERIOD": iters - 1, "SOLVER.CHECKPOINT_PERIOD": 1000,
                "DATALOADER.NUM_WORKERS": 2}  # fmt: skip
        opts = toy_opts(Path(tmp), keys, extra or (), size=80)
        trainer = PretrainTrainer(load_config(str(ROOT / config), opts))
        hook = SyncDebug("warn")
        trainer.register_hooks([hook])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            try:
                trainer.train()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(s["where"] for s in hook.syncs)
    n = max(hook.checked, 1)
    return {
        "config": config,
        "checked_iterations": hook.checked,
        "syncs_per_iteration": len(hook.syncs) / n,
        "by_source": {k: v / n for k, v in where.most_common()},
        "syncs": hook.syncs,  # each with its iteration, thread, origin and stack
    }
