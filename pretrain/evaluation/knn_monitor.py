"""The kNN monitor of pretraining: ``TEST.KNN_*`` -> :class:`KNNHook`, in one module.

Every ``TEST.KNN_PERIOD`` iterations and after the last one, the query encoder's backbone embeds
``TEST.KNN_TRAIN_IMAGES`` labelled references and ``TEST.KNN_TEST_IMAGES`` queries (centre crops
at INPUT.LARGE_SIZE, evenly spaced so that a class-sorted folder keeps every class), and the
weighted kNN top-1 goes to metrics.json as ``knn/top1``, with the collapse diagnostics of the
same features (:mod:`pretrain.evaluation.collapse`, no extra forward pass): ``knn/effective_rank``,
``knn/std``, ``knn/std_ratio``, ``knn/alignment`` (positive pairs: two references or queries of
one class, since the monitor embeds one view per image) and ``knn/uniformity``, computed on the
references and the queries together. One warning line when the embedding collapses
(:func:`~pretrain.evaluation.collapse.is_collapsed`). Register the hook before ``PeriodicWriter``
so the values are written in the same step.

Every process embeds its share, and the features reach the main process in one gather after all
the work, so a process waits there only for the slowest process's extra share; a warning names
the keys to change when that wait passes half of DIST.TIMEOUT_MINUTES (docs/performance.md, "The
kNN monitor"). The features are the single-process ones, bit for bit on the CPU
(tests/pretrain/evaluation/test_knn_monitor_distributed.py).

``feature_fn(images) -> (B, D)`` receives each batch as the loaders yield it (on CPU), handles
device and eval mode, and must run no collective (processes embed different numbers of batches).
The hook takes the model, not the trainer, so that the trainer can import this module.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Iterable

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from torch import nn
from torch.utils.data import DataLoader
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2 as T

from pretrain.config.defaults import ConfigError
from pretrain.data.datasets import (
    FASHION_MNIST,
    IMAGEFOLDER,
    FashionMNISTSource,
    ImageFolderSource,
    TransformedDataset,
    readable_loader,
)
from pretrain.data.loader import resolve_num_workers
from pretrain.data.splits import evenly_spaced, labelled_splits
from pretrain.evaluation.collapse import (
    MIN_EFFECTIVE_RANK,
    MIN_STD_RATIO,
    CollapseStats,
    collapse_stats,
    is_collapsed,
)
from pretrain.evaluation.features import (
    FeatureFn,
    GatheredEmbeddings,
    batch_shards,
    gather_embeddings,
)
from pretrain.evaluation.knn import KNN_K, KNN_T, knn_accuracy
from pretrain.utils.signals import shield_data_worker

__all__ = ["KNNHook", "build_knn_hook", "check_knn_root", "knn_sources", "knn_transform"]

logger = logging.getLogger(__name__)

# The workers start afresh at every evaluation: fork (milliseconds, sources shared copy-on-write)
# even under detectron2's spawn, whose workers import the stack and unpickle 1.28M paths each.
# They run no CUDA.
_WORKER_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else None

# warn when a process waited longer than this fraction of DIST.TIMEOUT_MINUTES at the gather
_WAIT_WARN_FRACTION = 0.5


class KNNHook(HookBase):
    """Weighted kNN top-1 every ``period`` iterations and after training -> ``knn/top1``.

    The loaders yield this process's share of the references and the queries; the main process
    gathers them and computes the kNN on ``device``. ``timeout_minutes`` (DIST.TIMEOUT_MINUTES,
    or None) bounds the wait at the gather before a warning.
    """

    def __init__(
        self,
        period: int,
        feature_fn: FeatureFn,
        train_loader: Iterable,
        test_loader: Iterable,
        num_classes: int,
        k: int = KNN_K,
        temperature: float = KNN_T,
        *,
        timeout_minutes: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if period < 1:
            raise ValueError(f"KNNHook period must be >= 1, got {period}")
        if num_classes < 2:
            raise ValueError(f"KNNHook num_classes must be >= 2, got {num_classes}")
        self._period = period
        self._feature_fn = feature_fn
        self._train_loader = train_loader
        self._test_loader = test_loader
        self._num_classes = num_classes
        self._k = k
        self._temperature = temperature
        self._timeout_minutes = timeout_minutes
        self._device = torch.device(device)
        self.last_top1: float | None = None  # main process only
        self.last_collapse: CollapseStats | None = None  # main process only
        # main process only: each process's seconds embedding its shares, and the set sizes
        self.last_seconds: list[float] = []
        self.last_counts: tuple[int, int] = (0, 0)

    def features(self) -> GatheredEmbeddings | None:
        """The current features of the references and the queries, gathered on the main
        process in the loaders' order (``None`` on the others; every process must call it)."""
        return gather_embeddings(self._feature_fn, [self._train_loader, self._test_loader])

    def compute(self) -> float | None:
        """kNN top-1 of the current features on the main process, ``None`` on the others (every
        process must call it: it gathers)."""
        gathered = self.features()
        if gathered is None:
            return None
        (train_x, train_y), (test_x, test_y) = gathered.sets
        self.last_seconds = gathered.seconds
        self.last_counts = (len(train_y), len(test_y))
        dev = self._device
        self.last_collapse = collapse_stats(
            torch.cat([train_x, test_x]).to(dev), torch.cat([train_y, test_y]).to(dev)
        )
        return knn_accuracy(
            train_x.to(dev),
            train_y,
            test_x.to(dev),
            test_y,
            self._num_classes,
            self._k,
            self._temperature,
        )

    def _run(self) -> None:
        start = time.perf_counter()
        top1 = self.compute()
        if top1 is None:  # not the main process: its share is delivered, training goes on
            return
        self.last_top1 = top1
        storage = self.trainer.storage
        storage.put_scalar("knn/top1", top1, smoothing_hint=False)
        stats = self.last_collapse
        if stats is not None:
            storage.put_scalars(**stats.scalars(), smoothing_hint=False)
        seconds, (refs, queries) = self.last_seconds, self.last_counts
        wait = max(seconds) - min(seconds)
        logger.info(
            "iter %d: kNN top-1 %.2f%% (%d references + %d queries on %d process(es) in %.1f s; "
            "%.0f images/s per process; longest wait at the gather %.1f s)",
            self.trainer.storage.iter,
            100 * top1,
            refs,
            queries,
            len(seconds),
            time.perf_counter() - start,
            (refs + queries) / max(sum(seconds), 1e-9),
            wait,
        )
        if stats is not None:
            self._report_collapse(stats)
        limit = self._timeout_minutes
        if len(seconds) > 1 and limit is not None and wait > _WAIT_WARN_FRACTION * 60 * limit:
            logger.warning(
                "the kNN monitor kept a process waiting %.0f s at its gather, more than %d%% of "
                "DIST.TIMEOUT_MINUTES (%s min): the processes' shares took %.0f-%.0f s. Lower "
                "TEST.KNN_TRAIN_IMAGES / TEST.KNN_TEST_IMAGES, raise DATALOADER.NUM_WORKERS, or "
                "switch the monitor off (TEST.KNN_PERIOD 0) before a wait passes the timeout",
                wait,
                round(100 * _WAIT_WARN_FRACTION),
                limit,
                min(seconds),
                max(seconds),
            )

    def _report_collapse(self, stats: CollapseStats) -> None:
        logger.info(
            "iter %d: kNN features: effective rank %.1f of %d, per-dimension std %.3g (x sqrt(d) "
            "= %.2f), alignment %.3f, uniformity %.3f",
            self.trainer.storage.iter,
            stats.effective_rank,
            stats.dim,
            stats.std,
            stats.std_ratio,
            stats.alignment,
            stats.uniformity,
        )
        if is_collapsed(stats):
            logger.warning(
                "the embedding has collapsed at iteration %d: effective rank %.2f (warns under "
                "%g), per-dimension std x sqrt(d) %.3f (warns under %g); see docs/pretraining.md, "
                '"Collapse diagnostics"',
                self.trainer.storage.iter,
                stats.effective_rank,
                MIN_EFFECTIVE_RANK,
                stats.std_ratio,
                MIN_STD_RATIO,
            )

    def after_step(self) -> None:
        next_iter = self.trainer.iter + 1
        if next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._run()  # the last iteration is handled in after_train

    def after_train(self) -> None:
        # trainer.iter == max_iter only when training finished (not after an exception)
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self._run()


def knn_sources(
    cfg: CfgNode,
) -> tuple[FashionMNISTSource | ImageFolderSource, FashionMNISTSource | ImageFolderSource]:
    """(reference source, test source) of the kNN monitor; ConfigError naming TEST.KNN_ROOT."""
    if cfg.DATASETS.TYPE == FASHION_MNIST:
        root = cfg.TEST.KNN_ROOT or cfg.DATASETS.ROOT
        return labelled_splits(FASHION_MNIST, root)
    check_knn_root(cfg)  # imagefolder or imagefiles: labelled image folders in train/ and val/
    # image files only, as knn_eval reads them: others (Thumbs.db, notes) left out and counted
    return labelled_splits(
        IMAGEFOLDER, cfg.TEST.KNN_ROOT, cfg.DATASETS.CLASS_LIST, extensions=IMG_EXTENSIONS
    )


def check_knn_root(cfg: CfgNode) -> None:
    """ConfigError unless an imagefolder or imagefiles run's TEST.KNN_ROOT has train/ and val/
    folders (cheap: nothing is listed; the command line checks it before anything is written)."""
    if cfg.DATASETS.TYPE == FASHION_MNIST or cfg.TEST.KNN_PERIOD <= 0:
        return
    root = cfg.TEST.KNN_ROOT
    if not root:
        raise ConfigError(
            f"TEST.KNN_ROOT = '': the kNN monitor of an {cfg.DATASETS.TYPE} run needs a labelled "
            "root with train/ and val/ class folders (or TEST.KNN_PERIOD 0)"
        )
    for sub in ("train", "val"):
        if not os.path.isdir(os.path.join(root, sub)):
            raise ConfigError(
                f"TEST.KNN_ROOT = {root!r}: no {sub}/ folder of labelled images for the kNN "
                "monitor (TEST.KNN_PERIOD > 0): pass TEST.KNN_ROOT <root with train/ and val/ "
                "class folders> (ImageNet's: the folder holding its train/), or TEST.KNN_PERIOD 0"
            )


def knn_transform(size: int) -> T.Compose:
    """The monitor's images: uint8 (3, size, size) centre crops (the model's own uint8 -> float
    normalisation runs in ``backbone_features``)."""
    return T.Compose([T.PILToTensor(), T.Resize(size), T.CenterCrop(size)])


def build_knn_hook(cfg: CfgNode, model: nn.Module) -> KNNHook:
    """The :class:`KNNHook` of ``model`` (DDP-wrapped or not) as ``cfg.TEST`` describes it, for
    this process's share; every process builds it."""
    train_src, test_src = knn_sources(cfg)
    size, t = cfg.INPUT.LARGE_SIZE, cfg.TEST
    rank, world = comm.get_rank(), comm.get_world_size()
    # as many as the training loader has (idle while the monitor runs: their batches are ready)
    workers = resolve_num_workers(cfg.DATALOADER.NUM_WORKERS, comm.get_local_size())

    # the module itself: DDP's forward would wait for a backward (and the backbone is all we run)
    model = model.module if hasattr(model, "module") else model
    device = model.device

    crop = knn_transform(size)

    subsets = [
        evenly_spaced(len(train_src), t.KNN_TRAIN_IMAGES),
        evenly_spaced(len(test_src), t.KNN_TEST_IMAGES),
    ]
    shares = batch_shards([len(s) for s in subsets], t.KNN_BATCH_SIZE, rank, world)

    def loader(source: FashionMNISTSource | ImageFolderSource, indices: list[int]) -> DataLoader:
        data = TransformedDataset(source, crop, indices)
        # no more workers than this share has batches (each evaluation starts them afresh)
        n = min(workers, -(-len(data) // t.KNN_BATCH_SIZE))
        return readable_loader(  # an unreadable image is skipped, never the run's end
            data,
            batch_size=t.KNN_BATCH_SIZE,
            shuffle=False,
            num_workers=n,
            multiprocessing_context=_WORKER_CONTEXT if n > 0 else None,
            pin_memory=device.type == "cuda",
            # SLURM signals every process of the job: the workers leave the stop to the trainer
            worker_init_fn=shield_data_worker if n > 0 else None,
        )

    return KNNHook(
        t.KNN_PERIOD,
        model.backbone_features,
        loader(train_src, [subsets[0][i] for i in shares[0]]),
        loader(test_src, [subsets[1][i] for i in shares[1]]),
        num_classes=len(train_src.classes),
        k=t.KNN_K,
        temperature=t.KNN_T,
        timeout_minutes=cfg.DIST.TIMEOUT_MINUTES,
        device=device,
    )
