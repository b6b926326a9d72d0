"""Index subsets (pretrain.data.splits): evenly spaced images and the seeded per-class split that
the transfer datasets, the semi-supervised tool and the study share."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain.data.datasets import FASHION_MNIST, IMAGEFOLDER
from pretrain.data.splits import evenly_spaced, labelled_splits, per_class_split
from pretrain.utils.errors import DatasetError
from tests.helpers import make_image_folder
from tests.helpers.analysis import make_fashion_mnist
from transfer.classification.datasets import labelled_sets
from transfer.classification.semi import heldout_indices
from transfer.classification.transfer_datasets import stratified_holdout


def _former_holdout(labels, fraction, seed):
    """transfer_datasets.stratified_holdout as it was written before per_class_split."""
    rng = np.random.default_rng(seed)
    keep, held = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        n_val = min(int(round(fraction * len(idx))), len(idx) - 1)
        held.append(idx[:n_val])
        keep.append(idx[n_val:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def _former_take(labels, counts, seed):
    """transfer_datasets._per_class_take (Caltech-101, Birdsnap) as it was written."""
    rng = np.random.default_rng(seed)
    parts = [[] for _ in range(len(counts) + 1)]
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        start = 0
        for i, n in enumerate(counts):
            parts[i].append(idx[start : start + n])
            start += n
        parts[-1].append(idx[start:])
    return [np.sort(np.concatenate(p)) for p in parts]


def _former_heldout(targets, exclude, per_class, seed):
    """semi.heldout_indices (semi-supervised and study probes) as it was written."""
    rng = np.random.default_rng(seed)
    targets = np.asarray(targets)
    out = []
    for c in np.unique(targets):
        pool = [i for i in np.flatnonzero(targets == c) if i not in exclude]
        out += [int(i) for i in rng.permutation(pool)[:per_class]]
    return sorted(out)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_per_class_split_keeps_the_indices_of_the_three_former_splits(seed):
    """Proves the one function reproduces, index for index, the three hand-written splits it
    replaces (the transfer splits and the study's documented probe results depend on them),
    on imbalanced labels with a single-image class and classes that lose every image."""
    rng = np.random.default_rng(100 + seed)
    labels = rng.choice(8, size=400, p=[0.3, 0.2, 0.15, 0.1, 0.1, 0.1, 0.0499, 0.0001])
    labels[17] = 7  # at least one single-image class
    for fraction in (0.2, 0.1):
        new = stratified_holdout(labels, fraction, seed)
        for a, b in zip(new, _former_holdout(labels, fraction, seed), strict=True):
            assert np.array_equal(a, b)
    for counts in ([30], [5, 5]):
        new = per_class_split(labels, counts, seed)
        for a, b in zip(new, _former_take(labels, counts, seed), strict=True):
            assert np.array_equal(a, b)
    exclude = set(range(0, 400, 3)) | set(np.flatnonzero(labels == 5).tolist())
    assert heldout_indices(labels.tolist(), exclude, 4, seed) == _former_heldout(
        labels.tolist(), exclude, 4, seed
    )


def test_per_class_split_parts_are_disjoint_and_sized():
    labels = np.repeat(np.arange(3), [10, 4, 1])
    first, second, rest = per_class_split(labels, [2, 3], seed=0)
    assert np.bincount(labels[first], minlength=3).tolist() == [2, 2, 1]
    assert np.bincount(labels[second], minlength=3).tolist() == [3, 2, 0]
    assert sorted(np.concatenate([first, second, rest]).tolist()) == list(range(15))
    held, keep = per_class_split(labels, lambda n: [n // 2], seed=0, exclude={0, 1})
    assert 0 not in held and 1 not in keep and len(held) + len(keep) == 13


def test_evenly_spaced_keeps_both_ends():
    assert evenly_spaced(10, 4) == [0, 3, 6, 9]
    assert evenly_spaced(3, 0) == evenly_spaced(3, 5) == [0, 1, 2]


def test_labelled_splits_of_fashion_mnist_take_the_first_images_of_each_split(tmp_path):
    root = make_fashion_mnist(tmp_path / "fm", n_train=20, n_test=10)
    train, test = labelled_splits(FASHION_MNIST, str(root), limits=(7, 4))
    assert (len(train), len(test)) == (7, 4)
    assert list(train.targets) == list(range(7)) and list(test.targets) == list(range(4))


def test_labelled_splits_of_image_folders_index_train_and_val_alike(tmp_path):
    make_image_folder(tmp_path / "train", classes=3, per_class=2)
    make_image_folder(tmp_path / "val", classes=3, per_class=1)
    train, test = labelled_splits(IMAGEFOLDER, str(tmp_path))
    assert train.classes == test.classes == ["class0", "class1", "class2"]
    assert (len(train), len(test)) == (6, 3)
    assert sorted(set(train.targets)) == sorted(set(test.targets)) == [0, 1, 2]


def test_labelled_sets_refuse_train_and_val_with_different_classes(tmp_path):
    make_image_folder(tmp_path / "train", classes=3, per_class=1)
    make_image_folder(tmp_path / "val", classes=2, per_class=1)
    with pytest.raises(DatasetError, match="different classes, e.g. \\['class2'\\]"):
        labelled_sets(IMAGEFOLDER, str(tmp_path))
