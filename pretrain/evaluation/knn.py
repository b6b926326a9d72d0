"""Weighted k-nearest-neighbour classification on L2-normalised features (Wu et al. 2018).

Each of the k nearest training features (cosine similarity s) votes for its label with weight
exp(s / T); the class with the largest total wins. Defaults k = 200, T = 0.07 as in the
InstDisc / MoCo literature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["knn_accuracy", "weighted_knn_predict"]


def weighted_knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    num_classes: int,
    k: int = 200,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores (num_test, num_classes) of weighted kNN; argmax gives the prediction.

    Features are L2-normalised here; ``train_labels`` are ints in [0, num_classes).
    """
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
    num_classes: int,
    k: int = 200,
    temperature: float = 0.07,
) -> float:
    """Top-1 accuracy (in [0, 1]) of :func:`weighted_knn_predict`."""
    scores = weighted_knn_predict(
        train_features, train_labels, test_features, num_classes, k, temperature
    )
    return (scores.argmax(1).cpu() == test_labels.long().cpu()).float().mean().item()
