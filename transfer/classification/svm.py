"""The VOC07 linear-SVM benchmark and its low-shot variant (Goyal et al. 2019, "Scaling and
Benchmarking Self-Supervised Visual Representation Learning"; as VISSL's ``svm_trainer.py`` /
``svm_low_shot_trainer.py`` and OpenSelfSup / mmselfsup run it).

* Features: the frozen backbone's res5 on images resized to ``SVM.IMAGE_SIZE`` squared (VISSL's
  ``Resize([224, 224])``), pooled by ``SVM.POOL`` (:func:`res5_features`), each row divided by
  its L2 norm + 1e-5 (:func:`normalize_features`).
* Full benchmark (:func:`train_test_svms`): per class, one scikit-learn ``LinearSVC`` (squared
  hinge, L2, dual, tol 1e-4, ``max_iter`` 2000, ``class_weight {1: 2, -1: 1}``) per cost of
  ``SVM.COSTS``, scored by 3-fold cross-validated AP on trainval (scikit-learn's
  ``average_precision``); the best cost's SVM, fit on all of trainval, is scored on test by the
  area AP (:func:`.voc07.voc_area_ap`) with difficult images left out. In training a class's
  difficult images count as negatives (VISSL turns every non-positive into -1).
* Low-shot (:func:`low_shot_draw`, :func:`low_shot_aps`): per class k positives and (C - 1) k
  negatives drawn from trainval (difficult never drawn), everything else left out; an SVM per
  cost of ``SVM.LOW_SHOT_COSTS``; test mAP per cost; per k the cost with the best mean over the
  draws is reported with the mean and std over draws at that cost (VISSL ``aggregate_stats``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import cross_val_score
from sklearn.svm import LinearSVC
from torch import nn

from .voc07 import DIFFICULT, NEGATIVE, POSITIVE, VOC_CLASSES, voc_area_ap

__all__ = [
    "POOLS",
    "as_numpy",
    "draw_positives",
    "fit_svm",
    "low_shot_aps",
    "low_shot_draw",
    "low_shot_summary",
    "normalize_features",
    "res5_features",
    "select_costs",
    "train_test_svms",
]

logger = logging.getLogger(__name__)

# "gap": res5 global-average-pooled (2048-d for ResNet-50); "avgpool6": AvgPool2d(6, stride 1) on
# res5 (2 x 2 x 2048 = 8192-d at 224 px), OpenSelfSup's / VISSL's "feat5" / "res5".
POOLS = ("gap", "avgpool6")


def res5_features(model: nn.Module, pool: str) -> nn.Module:
    """The torchvision ResNet ``model`` (``fc = Identity``) up to res5, pooled by ``pool``."""
    if pool not in POOLS:
        raise ValueError(f"pool {pool!r}: choose from {POOLS}")
    if pool == "gap":
        return model
    stem = [model.conv1, model.bn1, model.relu, model.maxpool]
    res = [model.layer1, model.layer2, model.layer3, model.layer4]
    return nn.Sequential(*stem, *res, nn.AvgPool2d(6, stride=1), nn.Flatten(1))


def normalize_features(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm + 1e-5 (VISSL ``SVMTrainer._normalize_features``)."""
    return x / (np.linalg.norm(x, axis=1) + 1e-5)[:, None]


def _svm(cost: float, max_iter: int, positive_weight: float) -> LinearSVC:
    return LinearSVC(
        C=cost,
        class_weight={1: positive_weight, -1: 1.0},
        intercept_scaling=1.0,
        penalty="l2",
        loss="squared_hinge",
        tol=1e-4,
        dual=True,
        max_iter=max_iter,
    )


def fit_svm(
    x: np.ndarray, y: np.ndarray, cost: float, max_iter: int = 2000, positive_weight: float = 2.0
) -> LinearSVC:
    """One ``LinearSVC`` on labels ``y`` in {1, -1}."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # VISSL's 2000 iterations, as is
        return _svm(cost, max_iter, positive_weight).fit(x, y)


def _cv_ap(
    x: np.ndarray, y: np.ndarray, cost: float, folds: int, max_iter: int, positive_weight: float
) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        aps = cross_val_score(
            _svm(cost, max_iter, positive_weight), x, y, cv=folds, scoring="average_precision"
        )
    return float(np.nanmean(aps)) if np.isfinite(aps).any() else float("nan")


def select_costs(cv_aps: np.ndarray, costs: Sequence[float]) -> list[float]:
    """Per class (row of ``cv_aps``, one column per cost) the cost of the best cross-validated AP;
    ties (and all-NaN rows) go to the first (smallest) cost, as ``np.argmax`` in VISSL."""
    filled = np.where(np.isfinite(cv_aps), cv_aps, -np.inf)
    return [float(costs[i]) for i in np.argmax(filled, axis=1)]


def train_test_svms(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    costs: Sequence[float],
    folds: int = 3,
    max_iter: int = 2000,
    positive_weight: float = 2.0,
    progress: Callable[[], object] | None = None,
) -> dict:
    """The full VOC07 SVM benchmark on (already normalised) features and (N, C) labels in
    {1, 0, -1}: per-class cross-validated AP per cost, the chosen cost, test AP; mAP.
    ``progress``: called once per (class, cost) trained (a progress bar's ``update``)."""
    num_classes = train_y.shape[1]
    cv = np.zeros((num_classes, len(costs)))
    for c in range(num_classes):
        y = np.where(train_y[:, c] == POSITIVE, 1, -1)  # difficult and absent: negatives
        for j, cost in enumerate(costs):
            cv[c, j] = _cv_ap(train_x, y, cost, folds, max_iter, positive_weight)
            if progress:
                progress()
    chosen = select_costs(cv, costs)
    test_ap = []
    for c in range(num_classes):
        y = np.where(train_y[:, c] == POSITIVE, 1, -1)
        clf = fit_svm(train_x, y, chosen[c], max_iter, positive_weight)
        test_ap.append(voc_area_ap(clf.decision_function(test_x), test_y[:, c]))
    names = list(VOC_CLASSES) if num_classes == len(VOC_CLASSES) else list(range(num_classes))
    return {
        "map": float(np.mean(test_ap)),
        "test_ap": dict(zip(map(str, names), test_ap, strict=True)),
        "chosen_cost": dict(zip(map(str, names), chosen, strict=True)),
        "cv_ap": cv.tolist(),
        "costs": list(costs),
    }


def draw_positives(
    labels: np.ndarray, value: int, count: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``count`` row indices per class (column) whose label is ``value``, drawn without
    replacement; a class with fewer is a ``ValueError`` naming it."""
    out = []
    for c in range(labels.shape[1]):
        pool = np.flatnonzero(labels[:, c] == value)
        if len(pool) < count:
            what = {POSITIVE: "positive", NEGATIVE: "negative"}[value]
            raise ValueError(
                f"class {c} has {len(pool)} {what} trainval images, fewer than the {count} a draw "
                "needs"
            )
        out.append(np.sort(rng.choice(pool, size=count, replace=False)))
    return out


def low_shot_draw(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """One low-shot draw (VISSL ``create_voc07_low_shot_samples.py``, seeded): an (N, C)
    matrix in {1, 0, -1} holding, per class, k drawn positives and (C - 1) k drawn negatives
    (never a difficult image); every other entry -1 (left out)."""
    rng = np.random.default_rng(seed)
    out = np.full(labels.shape, DIFFICULT, dtype=np.int64)
    num_classes = labels.shape[1]
    for value, count in ((POSITIVE, k), (NEGATIVE, (num_classes - 1) * k)):
        for c, rows in enumerate(draw_positives(labels, value, count, rng)):
            out[rows, c] = value
    return out


def low_shot_aps(
    train_x: np.ndarray,
    draw: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    costs: Sequence[float],
    max_iter: int = 2000,
    positive_weight: float = 2.0,
) -> list[float]:
    """Test mAP per cost of one draw's per-class SVMs (trained on the drawn rows only)."""
    aps = np.zeros((draw.shape[1], len(costs)))
    for c in range(draw.shape[1]):
        rows = draw[:, c] != DIFFICULT
        y = np.where(draw[rows, c] == POSITIVE, 1, -1)
        for j, cost in enumerate(costs):
            clf = fit_svm(train_x[rows], y, cost, max_iter, positive_weight)
            aps[c, j] = voc_area_ap(clf.decision_function(test_x), test_y[:, c])
    return aps.mean(axis=0).tolist()


def low_shot_summary(per_draw: Sequence[Sequence[float]], costs: Sequence[float]) -> dict:
    """Over the draws of one k (rows: draws, columns: costs): the cost with the best mean mAP
    and the mean, std, min and max over draws at it (VISSL ``aggregate_stats``; std is numpy's,
    over the draws)."""
    m = np.asarray(per_draw, dtype=float)
    best = int(np.argmax(m.mean(axis=0)))
    col = m[:, best]
    return {
        "cost": float(costs[best]),
        "mean": float(col.mean()),
        "std": float(col.std()),
        "min": float(col.min()),
        "max": float(col.max()),
        "draws": len(col),
    }


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A feature tensor as float64 numpy (VISSL casts the features to float64 as well)."""
    return t.double().cpu().numpy()
