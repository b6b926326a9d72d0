"""One (method, seed) run of the study: pretrain (resuming), evaluate three ways, write study.json.

Files in the run directory ``<output-dir>/<method>_seed<k>/``: the engine's checkpoints, logs and
metrics; ``train_stats.json`` (written when pretraining finishes: its wall time and throughput, so
that a re-evaluation keeps them); ``linear_probe_<checkpoint hash>/`` (the probe's head and logs,
keyed by the checkpoint so a retrained model never reuses a stale head); ``study.json`` (all
numbers of the run, written last: its presence marks the run done).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fvcore.common.config import CfgNode

from pretrain.engine.checkpoint import atomic_write_bytes

from .config import PROBE_DEFAULT_OPTS, StudyOptions

__all__ = ["RunPaths", "evaluate_run", "pretrain_run", "read_json", "write_json"]

logger = logging.getLogger(__name__)
_LOGGERS = ("pretrain", "detectron2", "transfer", "fvcore")


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


def write_json(path: str, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict:
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None


@contextmanager
def run_log(run_dir: str) -> Iterator[None]:
    """Also write the project's log lines to ``<run_dir>/log.txt`` while the run is on."""
    os.makedirs(run_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(run_dir, "log.txt"))
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    for name in _LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        yield
    finally:
        for name in _LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        handler.close()


def pretrain_run(cfg: CfgNode, run: RunPaths) -> dict:
    """Train (or finish training) ``run`` with the project's engine; returns its train stats.

    A run whose last checkpoint is final is not trained again; its ``train_stats.json`` from the
    invocation that finished it is returned.
    """
    from pretrain.engine.trainer import PretrainTrainer

    trainer = PretrainTrainer(cfg)
    trainer.resume()
    start_iter = trainer.start_iter
    if start_iter >= trainer.max_iter and os.path.isfile(run.train_stats):
        return read_json(run.train_stats)
    start = time.perf_counter()
    if start_iter < trainer.max_iter:
        trainer.train()
    seconds = time.perf_counter() - start
    trained = trainer.max_iter - start_iter
    stats = {
        "epochs": float(cfg.SOLVER.EPOCHS),
        "max_iter": trainer.max_iter,
        "ims_per_batch": int(cfg.SOLVER.IMS_PER_BATCH),
        "train_images": len(trainer.source),
        "views": int(cfg.INPUT.LARGE_CROPS + cfg.INPUT.SMALL_CROPS),
        "resumed_from_iter": start_iter,
        # time and speed of the iterations run by the invocation that finished training
        "train_seconds": seconds if trained else None,
        "images_per_sec": trained * cfg.SOLVER.IMS_PER_BATCH / seconds if trained else None,
    }
    write_json(run.train_stats, stats)
    return stats


def probe_overrides(cfg: CfgNode, opt: StudyOptions, seed: int, out: str) -> list[str]:
    """The probe config's overrides: Fashion-MNIST at the pretraining crop size, the run's seed."""
    size = str(cfg.INPUT.LARGE_SIZE)
    return [
        *("DATA.NAME", "fashion-mnist", "DATA.IMAGE_SIZE", size, "INPUT.TRAIN_CROP", size),
        *("INPUT.TEST_RESIZE", size, "INPUT.TEST_CROP", size, "SEED", str(seed)),
        *("DEVICE", cfg.MODEL.DEVICE, "OUTPUT_DIR", out),
        *PROBE_DEFAULT_OPTS,
        *opt.probe_opts,
    ]


def evaluate_run(cfg: CfgNode, run: RunPaths, opt: StudyOptions) -> dict:
    """kNN top-1, linear-probe top-1 and the test nuclear-norm statistic of the final checkpoint."""
    from detectron2.utils.env import seed_all_rng

    from pretrain.analysis.models import load_pretrained
    from pretrain.analysis.nuclear_norm_stats import (
        augmented_nuclear_norms,
        evenly_spaced,
        open_split,
        view_spec,
    )
    from pretrain.demo import knn_top1
    from transfer.classification.backbone import load_eval_backbone
    from transfer.classification.config import linear_probe_defaults
    from transfer.classification.config import load_config as load_probe_config
    from transfer.classification.engine import resolve_device
    from transfer.classification.probe import run_linear_probe

    root, device, out = cfg.DATASETS.ROOT, cfg.MODEL.DEVICE, {}

    t = time.perf_counter()
    backbone = load_eval_backbone(run.checkpoint)
    knn = knn_top1(backbone.model, root, cfg.INPUT.LARGE_SIZE, opt.knn_train, opt.knn_test)
    out.update(knn_top1=100.0 * knn, knn_seconds=time.perf_counter() - t)
    logger.info("%s: kNN top-1 %.2f%%", run.dir, out["knn_top1"])

    t = time.perf_counter()
    backbone = load_eval_backbone(run.checkpoint)  # a fresh copy: the probe moves and freezes it
    probe_dir = os.path.join(run.dir, f"linear_probe_{backbone.identity.split(':')[-1][:12]}")
    pcfg = load_probe_config(
        linear_probe_defaults(), opt.probe_config, probe_overrides(cfg, opt, run.seed, probe_dir)
    )
    os.makedirs(probe_dir, exist_ok=True)
    with open(os.path.join(probe_dir, "config.yaml"), "w") as f:
        f.write(pcfg.dump())
    seed_all_rng(pcfg.SEED)
    probe = run_linear_probe(pcfg, backbone, root, resolve_device(pcfg.DEVICE), resume=True)
    out.update(
        linear_top1=100.0 * probe.top1,
        linear_top5=100.0 * probe.top5,
        probe_iters=probe.max_iter,
        probe_batch=int(pcfg.SOLVER.BATCH_SIZE),
        probe_epochs=probe.max_iter * pcfg.SOLVER.BATCH_SIZE / probe.num_train,
        probe_image_size=int(pcfg.DATA.IMAGE_SIZE),
        probe_test_images=probe.num_val,
        probe_seconds=time.perf_counter() - t,
    )
    logger.info("%s: linear top-1 %.2f%%", run.dir, out["linear_top1"])

    t = time.perf_counter()
    model = load_pretrained(run.dir, device=device)
    test = open_split("fashion-mnist", root, "test")
    crop, color = view_spec(model.cfg, opt.nuclear_views)
    values = augmented_nuclear_norms(
        model.model.encoder_q,
        test,
        evenly_spaced(len(test), opt.nuclear_images),
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
