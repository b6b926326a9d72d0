"""Weighted kNN evaluation of a backbone on an ImageFolder or Fashion-MNIST.

Train and test features are extracted once (eval pipeline, cached like the transfer features)
and every test image is classified by its k nearest training features, see
:mod:`pretrain.evaluation.knn`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from pretrain.data.datasets import TransformedDataset
from pretrain.evaluation.features import extract_features
from pretrain.evaluation.knn import KNN_K, KNN_T, knn_accuracy

from .backbone import EvalBackbone
from .features import FeatureCache, labels_digest
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
        parts = {
            "backbone": backbone.identity,
            "dataset": name,
            "split": split,
            "transform": repr(transform),
            "num": len(ds),
            "labels": labels_digest(labels),
        }
        feats[split] = cache.get_or_compute(
            parts,
            lambda ds=ds, split=split: extract_features(
                backbone.model,
                TransformedDataset(ds, transform),
                device,
                batch_size,
                num_workers,
                desc=f"{name}/{split} features",
            ),
        )
    top1 = knn_accuracy(*feats["train"], *feats["test"], num_classes, k, temperature)
    return KNNResult(top1, k, temperature, len(train), len(test), num_classes)
