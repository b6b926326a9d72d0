"""Weighted k-nearest-neighbour classification on L2-normalised features (Wu et al. 2018).

Each of the k nearest reference features (cosine similarity s) votes for its label with weight
exp(s / T). The defaults (k = 200, T = 0.07, as InstDisc and MoCo) are the config's
``TEST.KNN_K`` and ``TEST.KNN_T``. The project's one kNN, for the monitor and every evaluation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from pretrain.config.defaults import get_cfg

from .features import FeatureFn, extract_features

__all__ = ["KNN_K", "KNN_T", "knn_accuracy", "knn_top1", "weighted_knn_predict"]

_TEST = get_cfg().TEST
KNN_K: int = _TEST.KNN_K  # neighbours that vote
KNN_T: float = _TEST.KNN_T  # temperature T of the exp(s / T) vote weights


def weighted_knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    num_classes: int,
    k: int = KNN_K,
    temperature: float = KNN_T,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores (num_test, num_classes) of weighted kNN (features L2-normalised here)."""
    if train_features.shape[0] != train_labels.shape[0]:
        raise ValueError(
            f"train_features has {train_features.shape[0]} rows, train_labels "
            f"{train_labels.shape[0]}"
        )
    if k < 1 or temperature <= 0:
        raise ValueError(f"need k >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    k = min(k, train_features.shape[0])
    train = F.normalize(train_features.float(), dim=1)
    test = F.normalize(test_features.float(), dim=1)
    labels = train_labels.long().to(train.device)
    scores = []
    for start in range(0, test.shape[0], chunk_size):
        sim = test[start : start + chunk_size] @ train.t()  # (b, n_train)
        top_sim, top_idx = sim.topk(k, dim=1)  # (b, k)
        weights = (top_sim / temperature).exp()
        votes = torch.zeros(sim.shape[0], num_classes, device=sim.device)
        votes.scatter_add_(1, labels[top_idx], weights)
        scores.append(votes)
    return torch.cat(scores)


def knn_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int | None = None,
    k: int = KNN_K,
    temperature: float = KNN_T,
) -> float:
    """Top-1 accuracy (in [0, 1]) of :func:`weighted_knn_predict` (``num_classes`` defaults to
    one more than the largest label)."""
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    scores = weighted_knn_predict(
        train_features, train_labels, test_features, num_classes, k, temperature
    )
    return (scores.argmax(1).cpu() == test_labels.long().cpu()).float().mean().item()


def knn_top1(
    model: nn.Module | FeatureFn,
    references: Dataset,
    test: Dataset,
    *,
    k: int = KNN_K,
    temperature: float = KNN_T,
    num_classes: int | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    num_workers: int = 0,
) -> float:
    """:func:`knn_accuracy` of ``model``'s features of the ``test`` images, the ``references``
    as neighbours."""
    f_ref, y_ref = extract_features(
        model, references, device, batch_size, num_workers, "kNN train features"
    )
    f_test, y_test = extract_features(
        model, test, device, batch_size, num_workers, "kNN test features"
    )
    return knn_accuracy(f_ref, y_ref, f_test, y_test, num_classes, k, temperature)
