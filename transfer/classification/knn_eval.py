"""Weighted kNN evaluation (:mod:`pretrain.evaluation.knn`) of a backbone on an ImageFolder or
Fashion-MNIST, on features extracted once and cached like the transfer features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from pretrain.evaluation.knn import KNN_K, KNN_T, knn_accuracy

from .backbone import EvalBackbone
from .features import FeatureCache, cached_features, labels_digest
from .transforms import eval_transform

__all__ = ["KNNResult", "run_knn"]


@dataclass
class KNNResult:
    top1: float
    k: int
    temperature: float
    num_train: int
    num_test: int
    num_classes: int


def run_knn(
    backbone: EvalBackbone,
    train: Dataset,
    test: Dataset,
    num_classes: int,
    name: str,
    resize: int,
    crop: int,
    k: int = KNN_K,
    temperature: float = KNN_T,
    cache: FeatureCache | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    num_workers: int = 0,
) -> KNNResult:
    cache = cache or FeatureCache("")
    transform = eval_transform(resize, crop)
    backbone.model.to(device)
    feats = {}
    for split, ds in (("train", train), ("test", test)):
        labels = torch.as_tensor(list(ds.targets), dtype=torch.int64)
        parts = {"dataset": name, "split": split, "num": len(ds), "labels": labels_digest(labels)}
        args = (device, batch_size, num_workers)
        feats[split] = cached_features(cache, backbone, ds, transform, parts, *args)
    top1 = knn_accuracy(*feats["train"], *feats["test"], num_classes, k, temperature)
    used = len(feats["train"][1]), len(feats["test"][1])  # without images skipped as unreadable
    return KNNResult(top1, k, temperature, *used, num_classes)
