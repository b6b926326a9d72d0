"""One (method, seed) run of the study: pretrain (resuming), evaluate three ways, write study.json.

``<output-dir>/<method>_seed<k>/`` holds the engine's files, ``train_stats.json`` (written when
pretraining finishes, so a re-evaluation keeps its time) and ``study.json`` (last: the run is done).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from detectron2.engine import HookBase
from fvcore.common.config import CfgNode

from .experiments import StudyOptions
from .records import read_json, write_json

if TYPE_CHECKING:
    import torch

__all__ = [
    "RunPaths",
    "WriteTrainStats",
    "evaluate_run",
    "pretrain_run",
    "run_config",
    "run_log",
    "train_stats",
]

logger = logging.getLogger(__name__)
LOGGERS = ("pretrain", "detectron2", "transfer", "fvcore")  # the loggers a study run writes


@dataclass(frozen=True)
class RunPaths:
    method: str
    seed: int
    dir: str

    @classmethod
    def of(cls, output_dir: str, method: str, seed: int) -> RunPaths:
        return cls(method, seed, os.path.join(output_dir, f"{method}_seed{seed}"))

    @property
    def study_json(self) -> str:
        return os.path.join(self.dir, "study.json")

    @property
    def train_stats(self) -> str:
        return os.path.join(self.dir, "train_stats.json")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.dir, "model_final.pth")

    @property
    def has_checkpoint(self) -> bool:
        """Whether training saved anything (detectron2's ``last_checkpoint`` pointer exists)."""
        return os.path.isfile(os.path.join(self.dir, "last_checkpoint"))


def run_config(cfg: CfgNode, run: RunPaths) -> CfgNode:
    """The config of ``run``: ``cfg`` (its method's) with the run's seed and output directory."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(["SEED", run.seed, "OUTPUT_DIR", run.dir])
    cfg.freeze()
    return cfg


@contextmanager
def run_log(run_dir: str) -> Iterator[None]:
    """Also write the project's log lines to ``<run_dir>/log.txt`` while the run is on."""
    os.makedirs(run_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(run_dir, "log.txt"))
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    for name in LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        yield
    finally:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        handler.close()


def train_stats(cfg: CfgNode, max_iter: int, images: int, start_iter: int, seconds: float) -> dict:
    """What ``train_stats.json`` holds: the run's length, the iteration its prior turned on at
    (None: no prior), and the time and speed of the iterations from ``start_iter``."""
    from .config import prior_on_iter

    trained = max_iter - start_iter
    return {
        "epochs": float(cfg.SOLVER.EPOCHS),
        "max_iter": max_iter,
        "prior_on_iter": prior_on_iter(cfg, images),
        "beta": float(cfg.LOSS.BETA),  # inf: the prior is off throughout (with prior_on_iter)
        "ims_per_batch": int(cfg.SOLVER.IMS_PER_BATCH),
        "train_images": images,
        "views": int(cfg.INPUT.LARGE_CROPS + cfg.INPUT.SMALL_CROPS),
        "resumed_from_iter": start_iter,
        "train_seconds": seconds if trained else None,
        "images_per_sec": trained * cfg.SOLVER.IMS_PER_BATCH / seconds if trained else None,
    }


def pretrain_run(cfg: CfgNode, run: RunPaths) -> dict:
    """Train (or finish training) ``run`` with the project's engine and :class:`WriteTrainStats`
    (as a SLURM pretraining job); returns the train stats of the invocation or job that finished
    it (a final checkpoint whose stats were lost: its length, no time)."""
    from pretrain.engine.run import run_pretraining

    t = run_pretraining(cfg, [WriteTrainStats(run.train_stats)])
    if not os.path.isfile(run.train_stats):
        write_json(run.train_stats, train_stats(cfg, t.max_iter, len(t.source), t.start_iter, 0))
    return read_json(run.train_stats)


class WriteTrainStats(HookBase):
    """Writes ``train_stats.json`` when pretraining trains its last iteration (a local run's, or
    a SLURM job's: picklable, it travels in the job)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def before_train(self) -> None:
        self._start, self._start_iter = time.perf_counter(), self.trainer.start_iter

    def after_train(self) -> None:
        from detectron2.utils import comm

        t = self.trainer
        if not comm.is_main_process() or t.iter + 1 < t.max_iter:  # stopped early: not final
            return
        seconds = time.perf_counter() - self._start
        write_json(
            self.path, train_stats(t.cfg, t.max_iter, len(t.source), self._start_iter, seconds)
        )


def linear_probe(
    f_train: torch.Tensor,
    y_train: torch.Tensor,
    f_test: torch.Tensor,
    y_test: torch.Tensor,
    opt: StudyOptions,
    seed: int,
) -> dict:
    """Top-1 of the transfer harness's linear classifier on frozen features: the lr chosen among
    ``probe_num_lrs`` log-spaced values on ``probe_heldout_per_class`` seeded reference images
    per class, then one classifier retrained on every reference image."""
    import torch

    from transfer.classification.linear import (
        best_index,
        iterations_for,
        log_spaced,
        predict,
        train_linear_heads,
    )
    from transfer.classification.semi import heldout_indices

    num_classes = int(max(y_train.max(), y_test.max())) + 1
    held = heldout_indices(y_train.tolist(), set(), opt.probe_heldout_per_class, seed)
    mask = torch.ones(len(y_train), dtype=torch.bool)
    mask[held] = False
    lrs = log_spaced(*opt.probe_lr_range, opt.probe_num_lrs)
    iters = iterations_for(0, opt.probe_epochs, int(mask.sum()), 256)
    heads = train_linear_heads(
        f_train[mask], y_train[mask], num_classes, lrs, iters, seed=seed, desc="probe lr sweep"
    )
    val = [
        float((predict(h, f_train[held]).argmax(1) == y_train[held]).float().mean()) for h in heads
    ]
    best = lrs[best_index(val)]
    iters_final = iterations_for(0, opt.probe_epochs, len(y_train), 256)
    (head,) = train_linear_heads(
        f_train, y_train, num_classes, [best], iters_final, seed=seed, desc="probe final"
    )
    top1 = float((predict(head, f_test).argmax(1) == y_test).float().mean())
    return {
        "linear_top1": 100.0 * top1,
        "probe_lr": best,
        "probe_val_top1": {f"{lr:.4g}": 100.0 * v for lr, v in zip(lrs, val, strict=True)},
        "probe_iters": iters_final,
        "probe_train_images": len(y_train),
        "probe_test_images": len(y_test),
    }


def evaluate_run(cfg: CfgNode, run: RunPaths, opt: StudyOptions) -> dict:
    """kNN top-1, linear-probe top-1 and the test nuclear-norm statistic of the final checkpoint."""
    from pretrain.evaluation.knn import knn_accuracy
    from transfer.analysis.models import load_pretrained
    from transfer.analysis.nuclear_norm_stats import augmented_nuclear_norms, open_split, view_spec
    from transfer.classification.backbone import load_eval_backbone
    from transfer.classification.demo import knn_features

    root, device, out = cfg.DATASETS.ROOT, cfg.MODEL.DEVICE, {}

    # one feature extraction serves the kNN and the linear probe
    t = time.perf_counter()
    backbone = load_eval_backbone(run.checkpoint)
    f_train, y_train, f_test, y_test = knn_features(
        backbone.model, root, cfg.INPUT.LARGE_SIZE, opt.knn_train, opt.knn_test
    )
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    knn = knn_accuracy(f_train, y_train, f_test, y_test, num_classes=num_classes)
    out.update(knn_top1=100.0 * knn)
    logger.info("%s: kNN top-1 %.2f%%", run.dir, out["knn_top1"])
    out.update(linear_probe(f_train, y_train, f_test, y_test, opt, run.seed))
    out.update(knn_probe_seconds=time.perf_counter() - t)
    logger.info("%s: linear top-1 %.2f%% (lr %.3g)", run.dir, out["linear_top1"], out["probe_lr"])

    t = time.perf_counter()
    model = load_pretrained(run.dir, device=device)
    test, indices = open_split("fashion-mnist", root, "test", count=opt.nuclear_images)
    crop, color = view_spec(model.cfg, opt.nuclear_views)
    values = augmented_nuclear_norms(
        model.model.encoder_q,
        test,
        indices,
        crop,
        color,
        seed=opt.nuclear_seed,
        device=device,
        desc=f"nuclear norm {os.path.basename(run.dir)}",
    )
    out.update(
        nuclear_mean=float(values.mean()),
        nuclear_std=float(values.std()),
        nuclear_count=len(values),
        nuclear_seconds=time.perf_counter() - t,
    )
    logger.info("%s: mean test ||Q_hat||_* %.4f", run.dir, out["nuclear_mean"])
    return out
