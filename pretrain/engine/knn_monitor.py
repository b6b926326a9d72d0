"""The kNN monitor of pretraining: ``TEST.KNN_*`` -> the project's :class:`KNNHook`.

Every ``TEST.KNN_PERIOD`` iterations and after the last one, the query encoder's backbone (eval
mode, the run's own uint8 -> float normalisation) embeds ``TEST.KNN_TRAIN_IMAGES`` labelled
reference images and ``TEST.KNN_TEST_IMAGES`` test images, centre-cropped at INPUT.LARGE_SIZE, and
the weighted kNN top-1 (k = TEST.KNN_K, T = TEST.KNN_T) goes to metrics.json as ``knn/top1``.

Images: Fashion-MNIST's train split (references) and test split (queries) under TEST.KNN_ROOT
(default DATASETS.ROOT); an ImageFolder run names a labelled root with ``train/`` and ``val/`` in
TEST.KNN_ROOT (DATASETS.CLASS_LIST applies). Subsets are evenly spaced over each split so that a
class-sorted folder keeps every class.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from fvcore.common.config import CfgNode
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
from pretrain.evaluation.knn_hook import KNNHook

if TYPE_CHECKING:  # trainer.py imports this module lazily; a run-time import would be a cycle
    from pretrain.engine.trainer import PretrainTrainer

__all__ = ["build_knn_hook", "knn_sources"]


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


def build_knn_hook(cfg: CfgNode, trainer: PretrainTrainer) -> KNNHook:
    """The :class:`KNNHook` for ``trainer`` (a PretrainTrainer) as ``cfg.TEST`` describes it."""
    train_src, test_src = knn_sources(cfg)
    size, t = cfg.INPUT.LARGE_SIZE, cfg.TEST

    # uint8 (3, s, s) centre crops: the model's own uint8 -> float normalisation runs in feature_fn
    crop = T.Compose([T.PILToTensor(), T.Resize(size), T.CenterCrop(size)])

    def loader(source: FashionMNISTSource | ImageFolderSource, count: int) -> DataLoader:
        data = TransformedDataset(source, crop, evenly_spaced(len(source), count))
        return DataLoader(data, batch_size=t.KNN_BATCH_SIZE, shuffle=False, num_workers=0)

    model = trainer.model.module if hasattr(trainer.model, "module") else trainer.model
    device = model.queues.device

    def feature_fn(images: torch.Tensor) -> torch.Tensor:
        backbone = model.encoder_q.backbone
        was_training = backbone.training
        backbone.eval()
        try:
            x = trainer.color_augment([images.to(device)], None, apply_color=False)[0]
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
