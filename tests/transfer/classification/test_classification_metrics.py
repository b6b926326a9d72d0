"""Metrics against scikit-learn, and the feature-based linear classifiers of the lr sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, balanced_accuracy_score, top_k_accuracy_score

from tests.helpers.classification import single_thread  # noqa: F401
from transfer.classification.augmented import LinearHeads
from transfer.classification.linear import (
    best_index,
    iterations_for,
    linear_head,
    log_spaced,
    predict,
    train_linear_heads,
)
from transfer.classification.metrics import (
    mean_per_class_accuracy,
    score,
    top1_accuracy,
    topk_accuracy,
)
from transfer.classification.transfer_datasets import TRANSFER_DATASETS, stratified_holdout


def test_mean_per_class_and_top1_differ_on_imbalanced_predictions():
    """Proves the two metrics are different functions: 8 right of class 0, 0 of 2 of class 1
    give top-1 0.8 but mean per-class 0.5 — the values scikit-learn computes too."""
    labels = torch.tensor([0] * 8 + [1] * 2)
    pred = torch.zeros(10, dtype=torch.long)
    assert top1_accuracy(pred, labels) == pytest.approx(0.8)
    assert mean_per_class_accuracy(pred, labels) == pytest.approx(0.5)
    assert accuracy_score(labels, pred) == pytest.approx(0.8)
    assert balanced_accuracy_score(labels, pred) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn_on_random_predictions(seed):
    """Proves agreement with scikit-learn on imbalanced random data, including a class that is
    predicted but never occurs (it must not count as a class)."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(6, size=300, p=[0.5, 0.2, 0.1, 0.1, 0.1, 0.0])
    logits = rng.normal(size=(300, 6))
    logits[np.arange(300), labels] += rng.uniform(0, 2, size=300)  # better than chance
    pred = logits.argmax(1)
    t_logits, t_labels = torch.tensor(logits), torch.tensor(labels)
    assert score("top1", t_logits, t_labels) == pytest.approx(accuracy_score(labels, pred))
    with pytest.warns(UserWarning):  # sklearn warns about the predicted-but-absent class
        expected = balanced_accuracy_score(labels, pred)
    assert score("mean_per_class", t_logits, t_labels) == pytest.approx(expected)
    top = topk_accuracy(t_logits, t_labels, (1, 5))
    assert top[1] == pytest.approx(accuracy_score(labels, pred))
    assert top[5] == pytest.approx(top_k_accuracy_score(labels, logits, k=5, labels=range(6)))


def test_non_finite_logits_count_as_wrong():
    """A diverged classifier (NaN logits) must not be scored by whatever argmax returns."""
    logits = torch.tensor([[float("nan"), 0.0], [0.0, 1.0]])
    assert score("top1", logits, torch.tensor([0, 1])) == pytest.approx(0.5)


def test_paper_metric_assignment():
    metric_of = {key: dataset.metric for key, dataset in TRANSFER_DATASETS}
    assert metric_of.pop("voc2007") == "map11"  # the 13th: VOC2007 devkit 11-point mAP
    assert {k for k, m in metric_of.items() if m == "mean_per_class"} == {
        "aircraft",
        "caltech101",
        "flowers",
        "pets",
    }
    assert len(metric_of) == 12 and set(metric_of.values()) == {"top1", "mean_per_class"}


def test_log_spaced_sweep_values():
    lrs = log_spaced(0.1, 100.0, 7)
    expected = [0.1, 10**-0.5, 1.0, 10**0.5, 10.0, 10**1.5, 100.0]
    assert lrs == pytest.approx(expected)
    assert log_spaced(0.01, 10.0, 7)[3] == pytest.approx(10**-0.5)


def test_best_index_prefers_smaller_lr_on_ties():
    assert best_index([0.1, 0.5, 0.5, 0.2]) == 1
    with pytest.raises(ValueError):
        best_index([])


def test_budgets():
    assert iterations_for(5000, 0, 10_000, 256) == 5000
    assert iterations_for(0, 100, 1000, 256) == 400  # 100 epochs x ceil(1000/256)
    with pytest.raises(ValueError):
        iterations_for(10, 10, 100, 8)


def test_stratified_holdout_is_seeded_disjoint_and_per_class():
    labels = np.repeat(np.arange(4), [10, 20, 5, 1])
    keep, held = stratified_holdout(labels, 0.2, seed=3)
    assert not set(keep) & set(held) and len(keep) + len(held) == len(labels)
    assert np.bincount(labels[held], minlength=4).tolist() == [2, 4, 1, 0]
    assert np.array_equal(held, stratified_holdout(labels, 0.2, seed=3)[1])
    assert not np.array_equal(held, stratified_holdout(labels, 0.2, seed=4)[1])


def test_sweep_heads_equal_independent_training():
    """Proves training 3 lrs in one loop is the same as 3 separate runs (same batches)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 8, generator=gen), torch.randint(0, 3, (50,), generator=gen)
    lrs = [0.1, 1.0, 10.0]
    joint = train_linear_heads(x, y, 3, lrs, iters=7, batch_size=16, seed=5)
    for lr, head in zip(lrs, joint, strict=True):
        (alone,) = train_linear_heads(x, y, 3, [lr], iters=7, batch_size=16, seed=5)
        torch.testing.assert_close(head.weight, alone.weight)
        torch.testing.assert_close(head.bias, alone.bias)
    assert not torch.allclose(joint[0].weight, joint[2].weight)


def test_linear_heads_learn_separable_data():
    """Proves the SGD + cosine loop actually fits: separable blobs reach > 95% accuracy."""
    gen = torch.Generator().manual_seed(1)
    centers = torch.randn(4, 16, generator=gen) * 4
    y = torch.randint(0, 4, (400,), generator=gen)
    x = centers[y] + torch.randn(400, 16, generator=gen)
    (head,) = train_linear_heads(x, y, 4, [0.5], iters=200, batch_size=64)
    assert top1_accuracy(predict(head, x).argmax(1), y) > 0.95


def test_linear_heads_reject_bad_labels():
    with pytest.raises(ValueError, match="labels must lie"):
        train_linear_heads(torch.randn(4, 2), torch.tensor([0, 1, 2, 3]), 3, [1.0], iters=1)


def test_linear_head_is_mocos_initialisation_from_the_given_stream():
    """Proves the one linear-head initialisation draws N(0, 0.01) weights from the generator it
    is given (so the sweep's heads and the augmented protocol's heads stay as they were) and
    zeroes the biases."""
    head = linear_head(64, 10, torch.Generator().manual_seed(3))
    expected = torch.empty(10, 64).normal_(0.0, 0.01, generator=torch.Generator().manual_seed(3))
    assert torch.equal(head.weight.detach(), expected) and not head.bias.any()
    assert abs(float(linear_head(512, 100).weight.detach().std()) - 0.01) < 0.001  # global RNG
    heads = LinearHeads(64, 10, num_heads=3, seed=3)
    assert all(torch.equal(h.weight.detach(), expected) and not h.bias.any() for h in heads)
