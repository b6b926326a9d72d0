"""Classification metrics as fractions in [0, 1]: ``top1`` and ``mean_per_class`` (Sec. 6.1's
metric for Aircraft, Caltech-101, Flowers and Pets) are scikit-learn's; ``map11`` (multi-label
VOC2007) is the VOC2007 devkit's 11-point mAP (:mod:`.voc07`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from sklearn.metrics import accuracy_score, balanced_accuracy_score

from .voc07 import voc_map

__all__ = [
    "METRICS",
    "mean_per_class_accuracy",
    "score",
    "top1_accuracy",
    "topk_accuracy",
    "topk_hits",
]

METRICS = ("top1", "mean_per_class", "map11")


def _check(pred: torch.Tensor, labels: torch.Tensor) -> None:
    if pred.shape[0] != labels.shape[0]:
        raise ValueError(f"{pred.shape[0]} predictions for {labels.shape[0]} labels")
    if labels.numel() == 0:
        raise ValueError("no samples to score")


def top1_accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of ``pred`` (class ids, (N,)) equal to ``labels`` (N,)."""
    _check(pred, labels)
    return float(accuracy_score(labels.long().cpu().numpy(), pred.long().cpu().numpy()))


def mean_per_class_accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over the classes present in ``labels`` of their recall; a predicted class absent
    from ``labels`` (or a diverged row's -1) is not a class, which scikit-learn warns of."""
    _check(pred, labels)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "y_pred contains classes not in y_true")
        value = balanced_accuracy_score(labels.long().cpu().numpy(), pred.long().cpu().numpy())
    return float(value)


def topk_accuracy(
    logits: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = (1, 5)
) -> dict[int, float]:
    """``{k: fraction of rows whose label is among the k highest logits}``; k is capped at C.
    Not scikit-learn's ``top_k_accuracy_score``: it rejects (N, 2) scores, warns when k >= C and
    breaks ties otherwise than ``torch.topk`` (the rest of this harness)."""
    _check(logits, labels)
    hits = topk_hits(logits.cpu(), labels.cpu(), ks)  # (N, len(ks))
    return {k: hits[:, i].float().mean().item() for i, k in enumerate(ks)}


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """(N, len(ks)) booleans: whether row n's label is among its ``ks[i]`` highest logits (k is
    capped at C); :func:`topk_accuracy` and ``engine.evaluate_topk`` both count these."""
    maxk = min(max(ks), logits.shape[1])
    hit = logits.topk(maxk, dim=1).indices == labels.long()[:, None]  # (N, maxk)
    return torch.stack([hit[:, : min(k, maxk)].any(dim=1) for k in ks], dim=1)


def score(metric: str, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """``metric`` of the argmax of ``logits`` (N, C); a row with a non-finite logit (a diverged
    classifier) counts as wrong."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}, choose from {METRICS}")
    if metric == "map11":  # labels (N, C) in {1, 0, -1 difficult}; a diverged score ranks last
        scores = torch.where(torch.isfinite(logits), logits, torch.tensor(-torch.inf))
        return voc_map(scores.double().cpu().numpy(), labels.cpu().numpy(), "ap11")[0]
    pred = logits.argmax(1)
    pred[~torch.isfinite(logits).all(dim=1)] = -1
    if metric == "top1":
        return top1_accuracy(pred, labels)
    return mean_per_class_accuracy(pred, labels)
