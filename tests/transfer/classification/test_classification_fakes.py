"""Tiny fake copies of the 12 transfer datasets in their real on-disk layouts, and checks that
each is read (through torchvision's classes, ``download=False``) with the expected splits.

The generators and the ``no_md5`` / ``single_thread`` fixtures are in
``tests.helpers.classification``, shared with the other classification tests.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.classification import (  # noqa: F401
    MAKERS,
    make_all,
    make_sun397,
    no_md5,
    single_thread,
)
from transfer.classification.transfer_datasets import (
    DATASET_NAMES,
    BuildContext,
    build_transfer_dataset,
)


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer_data")
    return str(root), make_all(str(root))


def test_makers_cover_every_dataset():
    assert set(MAKERS) == set(DATASET_NAMES)


@pytest.mark.parametrize("key", list(DATASET_NAMES))
def test_each_fake_dataset_reads_with_expected_splits(key, fake_root, no_md5, tmp_path):  # noqa: F811
    """Proves every reader parses its published layout and forms disjoint train/val/test."""
    root, expected = fake_root
    data = build_transfer_dataset(key, os.path.join(root, key), BuildContext(0, 0.2, str(tmp_path)))
    exp = expected[key]
    assert sum(len(ds) for ds in data.sources.values()) == exp["images"]
    assert [data.split_size(s) for s in ("train", "val", "test")] == [
        exp["train"],
        exp["val"],
        exp["test"],
    ]
    for src, ds in data.sources.items():  # labels read without decoding match the images'
        img, label = ds[len(ds) - 1]
        assert label == data.labels[src][-1]
        assert hasattr(img, "size")


def test_sun397_partitions_inside_the_data_dir(tmp_path):
    """Partitions.zip unpacked into <root>/SUN397/Partitions/ works as well as <root>/."""
    make_sun397(str(tmp_path), partitions_in="SUN397")
    data = build_transfer_dataset("sun397", str(tmp_path))
    assert data.split_size("test") == 6
