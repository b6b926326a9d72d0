"""The VOC07 SVM benchmark's pieces on planted data: separable features give mAP 100, low-shot
draws hold exactly k positives per class and are reproducible, costs are chosen as documented."""

from __future__ import annotations

import numpy as np
import pytest

from transfer.classification.svm import (
    low_shot_aps,
    low_shot_draw,
    low_shot_summary,
    normalize_features,
    select_costs,
    train_test_svms,
)


def _planted(n: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels in {1, 0, -1} (two positives per image, some difficult) and features that hold
    each class's indicator in their own coordinate plus small noise: linearly separable."""
    rng = np.random.default_rng(seed)
    labels = np.zeros((n, classes), dtype=np.int64)
    for i in range(n):
        labels[i, [i % classes, (i + 3) % classes]] = 1
        if i % 4 == 0:
            labels[i, (i + 1) % classes] = -1
    feats = (labels == 1).astype(float) + 0.01 * rng.standard_normal((n, classes))
    return normalize_features(feats), labels


def test_svms_on_separable_planted_features_give_map_100():
    """Proves the per-class SVMs, the CV cost choice and the test AP (difficult left out) end
    in mAP 100 when every class is separable."""
    xtr, ytr = _planted(60, 5, 0)
    xte, yte = _planted(30, 5, 1)
    result = train_test_svms(xtr, ytr, xte, yte, costs=(0.1, 1.0, 10.0), folds=3)
    assert result["map"] == pytest.approx(1.0)
    assert set(result["chosen_cost"].values()) <= {0.1, 1.0, 10.0}
    draw = low_shot_draw(ytr, 2, seed=0)
    assert low_shot_aps(xtr, draw, xte, yte, costs=(1.0,)) == pytest.approx([1.0])


def test_every_low_shot_draw_holds_exactly_k_positives_and_same_seed_same_draw():
    """Per class exactly k positives and (C - 1) k negatives, drawn among the class's positive
    and absent images (never a difficult one), all other entries left out; the same seed gives
    the same draw, another seed another."""
    _, labels = _planted(200, 5, 0)
    for k in (1, 2, 4, 8):
        draw = low_shot_draw(labels, k, seed=3)
        assert ((draw == 1).sum(axis=0) == k).all()
        assert ((draw == 0).sum(axis=0) == 4 * k).all()
        assert (labels[draw == 1] == 1).all() and (labels[draw == 0] == 0).all()
        assert np.array_equal(draw, low_shot_draw(labels, k, seed=3))
    assert not np.array_equal(low_shot_draw(labels, 8, 3), low_shot_draw(labels, 8, 4))


def test_a_draw_larger_than_a_class_names_the_class():
    _, labels = _planted(20, 5, 0)
    with pytest.raises(ValueError, match="class 0 has 8 positive"):
        low_shot_draw(labels, 9, seed=0)


def test_costs_chosen_by_best_cv_ap_ties_to_the_smaller_and_low_shot_by_best_mean():
    cv = np.array([[0.5, 0.9, 0.9], [np.nan, np.nan, np.nan], [0.7, 0.2, np.nan]])
    assert select_costs(cv, (0.1, 1.0, 10.0)) == [1.0, 0.1, 0.1]
    summary = low_shot_summary([[0.2, 0.5], [0.4, 0.3]], (1.0, 10.0))
    assert summary["cost"] == 10.0 and summary["mean"] == pytest.approx(0.4)
    assert summary["std"] == pytest.approx(0.1) and summary["draws"] == 2
