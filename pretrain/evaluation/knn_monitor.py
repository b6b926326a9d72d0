"""The kNN monitor of pretraining: ``TEST.KNN_*`` -> :class:`KNNHook`, in one module.

Every ``TEST.KNN_PERIOD`` iterations and after the last one (stored at ``max_iter``, as
detectron2's ``EvalHook`` does), the query encoder's backbone (eval mode, the run's own uint8 ->
float normalisation) embeds ``TEST.KNN_TRAIN_IMAGES`` labelled reference images and
``TEST.KNN_TEST_IMAGES`` test images, centre-cropped at INPUT.LARGE_SIZE, and the weighted kNN
top-1 (k = TEST.KNN_K, T = TEST.KNN_T; :mod:`.knn`) goes to metrics.json as ``knn/top1`` (a
fraction in [0, 1]). Register the hook before ``PeriodicWriter`` so the value is written in the
same step.

Images: Fashion-MNIST's train split (references) and test split (queries) under TEST.KNN_ROOT
(default DATASETS.ROOT); an ImageFolder run names a labelled root with ``train/`` and ``val/`` in
TEST.KNN_ROOT (DATASETS.CLASS_LIST applies). Subsets are evenly spaced over each split so that a
class-sorted folder keeps every class.

Contract of ``feature_fn(images) -> (B, D) features`` (:class:`KNNHook`): it receives each batch
exactly as the loaders yield it (on CPU), moves it to its device, and is responsible for eval
mode; :func:`build_knn_hook` builds it from the model. The hook embeds with
:func:`.features.embed` (under ``torch.no_grad()``) on the main process only (the other
processes wait at a barrier); it is meant for small monitoring sets, not full ImageNet.

The hook takes the model and the run's normalisation, not the trainer, so that the trainer can
import this module (until 2026-11 the two imported each other).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import v2 as T

from pretrain.config.defaults import ConfigError
from pretrain.data.datasets import (
    FASHION_MNIST,
    FashionMNISTSource,
    ImageFolderSource,
    TransformedDataset,
)
from pretrain.data.splits import evenly_spaced, labelled_splits
from pretrain.evaluation.features import FeatureFn, embed
from pretrain.evaluation.knn import KNN_K, KNN_T, knn_accuracy

__all__ = ["KNNHook", "build_knn_hook", "knn_sources"]

logger = logging.getLogger(__name__)

# uint8 views -> normalised float views, e.g. the trainer's BatchColorAugment with apply_color off
Normalize = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class KNNHook(HookBase):
    """Weighted kNN top-1 every ``period`` iterations and after training -> ``knn/top1``."""

    def __init__(
        self,
        period: int,
        feature_fn: FeatureFn,
        train_loader: Iterable,
        test_loader: Iterable,
        num_classes: int,
        k: int = KNN_K,
        temperature: float = KNN_T,
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
        self.last_top1: float | None = None

    def compute(self) -> float:
        """kNN top-1 of the current features (also usable outside a trainer)."""
        train_x, train_y = embed(self._feature_fn, self._train_loader)
        test_x, test_y = embed(self._feature_fn, self._test_loader)
        return knn_accuracy(
            train_x, train_y, test_x, test_y, self._num_classes, self._k, self._temperature
        )

    def _run(self) -> None:
        if comm.is_main_process():
            self.last_top1 = self.compute()
            self.trainer.storage.put_scalar("knn/top1", self.last_top1, smoothing_hint=False)
            logger.info(
                "iter %d: kNN top-1 %.2f%%", self.trainer.storage.iter, 100 * self.last_top1
            )
        comm.synchronize()

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
    root = cfg.TEST.KNN_ROOT
    if not root:
        raise ConfigError(
            "TEST.KNN_ROOT = '': the kNN monitor of an imagefolder run needs a labelled root "
            "with train/ and val/ class folders"
        )
    for sub in ("train", "val"):
        if not os.path.isdir(os.path.join(root, sub)):
            raise ConfigError(f"TEST.KNN_ROOT = {root!r}: no {sub}/ folder of labelled images")
    return labelled_splits(cfg.DATASETS.TYPE, root, cfg.DATASETS.CLASS_LIST)


def build_knn_hook(cfg: CfgNode, model: nn.Module, normalize: Normalize) -> KNNHook:
    """The :class:`KNNHook` of ``model`` (a pretraining model, DDP-wrapped or not) as
    ``cfg.TEST`` describes it; ``normalize`` turns uint8 views into the model's float input."""
    train_src, test_src = knn_sources(cfg)
    size, t = cfg.INPUT.LARGE_SIZE, cfg.TEST

    # uint8 (3, s, s) centre crops: the model's own uint8 -> float normalisation runs in feature_fn
    crop = T.Compose([T.PILToTensor(), T.Resize(size), T.CenterCrop(size)])

    def loader(source: FashionMNISTSource | ImageFolderSource, count: int) -> DataLoader:
        data = TransformedDataset(source, crop, evenly_spaced(len(source), count))
        return DataLoader(data, batch_size=t.KNN_BATCH_SIZE, shuffle=False, num_workers=0)

    model = model.module if hasattr(model, "module") else model
    device = model.queues.device

    def feature_fn(images: torch.Tensor) -> torch.Tensor:
        backbone = model.encoder_q.backbone
        was_training = backbone.training
        backbone.eval()
        try:
            x = normalize([images.to(device)])[0]
            if model.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return backbone(x)
        finally:
            backbone.train(was_training)

    return KNNHook(
        t.KNN_PERIOD,
        feature_fn,
        loader(train_src, t.KNN_TRAIN_IMAGES),
        loader(test_src, t.KNN_TEST_IMAGES),
        num_classes=len(train_src.classes),
        k=t.KNN_K,
        temperature=t.KNN_T,
    )
