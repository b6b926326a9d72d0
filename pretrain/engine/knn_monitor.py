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

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2 as T

from pretrain.config import ConfigError
from pretrain.data.datasets import FashionMNISTSource, ImageFolderSource
from pretrain.evaluation.knn_hook import KNNHook

__all__ = ["build_knn_hook", "knn_sources"]


class _Labelled(Dataset):
    """Item k: uint8 (3, s, s) centre crop of ``source`` image ``indices[k]`` and its label."""

    def __init__(self, source, indices: list[int], size: int):
        self.source, self.indices = source, indices
        self.transform = T.Compose([T.PILToTensor(), T.Resize(size), T.CenterCrop(size)])

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, int]:
        i = self.indices[k]
        return self.transform(self.source.load(i)), self.source.label(i)


def _spread(total: int, count: int) -> list[int]:
    if count >= total:
        return list(range(total))
    return [int(i) for i in np.linspace(0, total - 1, count).round()]


def knn_sources(cfg):
    """(reference source, test source) of the kNN monitor; ConfigError naming TEST.KNN_ROOT."""
    if cfg.DATASETS.TYPE == "fashion_mnist":
        root = cfg.TEST.KNN_ROOT or cfg.DATASETS.ROOT
        return FashionMNISTSource(root, "train"), FashionMNISTSource(root, "test")
    root = cfg.TEST.KNN_ROOT
    if not root:
        raise ConfigError(
            "TEST.KNN_ROOT = '': the kNN monitor of an imagefolder run needs a labelled root "
            "with train/ and val/ class folders"
        )
    for sub in ("train", "val"):
        if not os.path.isdir(os.path.join(root, sub)):
            raise ConfigError(f"TEST.KNN_ROOT = {root!r}: no {sub}/ folder of labelled images")
    return (
        ImageFolderSource(os.path.join(root, "train"), cfg.DATASETS.CLASS_LIST),
        ImageFolderSource(os.path.join(root, "val"), cfg.DATASETS.CLASS_LIST),
    )


def build_knn_hook(cfg, trainer) -> KNNHook:
    """The :class:`KNNHook` for ``trainer`` (a PretrainTrainer) as ``cfg.TEST`` describes it."""
    train_src, test_src = knn_sources(cfg)
    size, t = cfg.INPUT.LARGE_SIZE, cfg.TEST

    def loader(source, count: int) -> DataLoader:
        data = _Labelled(source, _spread(len(source), count), size)
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
