"""One record per transfer dataset: a decorated builder is all a new dataset needs. Once it is
registered, the config's defaults (datasets, roots, budget), the config's check of
TRANSFER.DATASETS, the dataset's name and metric and build_transfer_dataset all know it; a
record with a bad metric or budget is refused where it is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from pretrain.utils.errors import ConfigError
from transfer.classification.config import load_config, transfer_defaults
from transfer.classification.transfer_datasets import (
    DATASET_NAMES,
    TRANSFER_DATASETS,
    TransferData,
    TransferDataset,
    build_transfer_dataset,
    transfer_dataset,
)


@pytest.fixture
def toy_registered():
    """A 'toy' dataset registered for the test and taken out of the registry after it."""

    @transfer_dataset("Toy", "<root>/nothing needed", metric="mean_per_class", iters=7)
    def toy(root: str, ctx) -> TransferData:
        labels = np.array([0, 1, 0, 1, 0, 1])
        src = {"all": TensorDataset(torch.zeros(6, 1))}
        splits = {
            s: [("all", np.array(i))]
            for s, i in zip(("train", "val", "test"), ([0, 1], [2, 3], [4, 5]), strict=True)
        }
        return TransferData("toy", root, 2, src, {"all": labels}, splits, "toy split")

    try:
        yield toy
    finally:
        TRANSFER_DATASETS._obj_map.pop("toy")  # fvcore has no public unregister


def test_a_registered_dataset_is_known_everywhere(toy_registered, tmp_path):
    assert list(DATASET_NAMES)[-1] == "toy" and DATASET_NAMES["toy"] == "Toy"
    c = transfer_defaults()
    assert "toy" in c.TRANSFER.DATASETS and c.TRANSFER.ROOTS.TOY == ""
    assert (c.TRANSFER.BUDGET.TOY.ITERS, c.TRANSFER.BUDGET.TOY.EPOCHS) == (7, 0)
    load_config(transfer_defaults(), opts=["TRANSFER.DATASETS", "['toy']"])  # passes the check
    data = build_transfer_dataset("toy", str(tmp_path))
    assert (data.name, data.metric, data.split_size("test")) == ("Toy", "mean_per_class", 2)


def test_unregistered_datasets_are_refused():
    with pytest.raises(ValueError, match="unknown transfer dataset 'toy'"):
        build_transfer_dataset("toy", "/tmp")
    with pytest.raises(ConfigError, match="TRANSFER.DATASETS"):
        load_config(transfer_defaults(), opts=["TRANSFER.DATASETS", "['toy']"])
    assert "toy" not in DATASET_NAMES and len(DATASET_NAMES) == 12


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"metric": "top5"}, "metric 'top5'"),
        ({"iters": 0}, "exactly one must be > 0"),
        ({"epochs": 10}, "exactly one must be > 0"),
    ],
)
def test_a_bad_record_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        TransferDataset("bad", "Bad", "<root>", lambda root, ctx: None, **kw)
    assert "bad" not in TRANSFER_DATASETS
