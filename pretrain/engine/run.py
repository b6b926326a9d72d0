"""One sequence for every way a pretraining run is started: build, resume, train what is left.

The CLI (``tools/train_pretrain.py``, in each launched process), the SLURM job
(:mod:`pretrain.cluster.jobs`), the study (:mod:`transfer.study.run`) and the demo
(:mod:`transfer.classification.demo`) all call :func:`run_pretraining` after their own set-up
(joining a process group and holding ``OUTPUT_DIR`` for the first two, loggers for the last two).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from detectron2.engine import HookBase
from fvcore.common.config import CfgNode
from torch.utils.data import Dataset

from pretrain.data.datasets import build_source
from pretrain.engine.trainer import PretrainTrainer, schedule_lengths

__all__ = ["run_pretraining", "train_source"]

logger = logging.getLogger(__name__)


def train_source(cfg: CfgNode) -> Dataset:
    """The images ``cfg`` trains on, scanned (once: ImageNet has 1.28M files) and checked
    against the schedule (a batch larger than the dataset is refused); reads only. A set-up
    that writes (a lock, a log) scans first and passes the result to :func:`run_pretraining`."""
    source = build_source(cfg, "train")
    schedule_lengths(cfg, len(source))
    return source


def run_pretraining(
    cfg: CfgNode,
    extra_hooks: Sequence[HookBase] = (),
    stop_on_interrupt: bool = False,
    resume_with_changes: bool = False,
    source: Dataset | None = None,
    log_to: Sequence[str] = (),
) -> PretrainTrainer:
    """Build the trainer of ``cfg`` (and ``extra_hooks``; ``stop_on_interrupt``: Ctrl-C saves a
    checkpoint and stops, as SIGTERM does), resume from
    ``OUTPUT_DIR/last_checkpoint`` when there is one, and train the iterations left; a run whose
    last checkpoint is final is not trained again. ``resume_with_changes``: the resume may change
    the learning rate or the schedule's length (``--resume-with-changes``,
    :mod:`pretrain.engine.config_changes`). ``source``: the :func:`train_source` of ``cfg``
    when the caller has it (else the trainer scans the data). Returns the trainer:
    ``start_iter`` (where this call started), ``max_iter``, and ``train_seconds`` (the time
    spent in ``train()``, 0.0 when nothing was left). ``log_to``: the optional writers
    (:func:`pretrain.engine.writers.build_writers`)."""
    trainer = PretrainTrainer(cfg, stop_on_interrupt, resume_with_changes, source, log_to)
    trainer.register_hooks(list(extra_hooks))
    trainer.resume()
    if trainer.start_iter >= trainer.max_iter:
        logger.info(
            f"{cfg.OUTPUT_DIR} holds the final checkpoint (iteration {trainer.max_iter}): "
            "nothing left to train"
        )
        return trainer
    start = time.perf_counter()
    trainer.train()
    trainer.train_seconds = time.perf_counter() - start
    return trainer
