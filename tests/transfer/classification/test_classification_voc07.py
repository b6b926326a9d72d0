"""VOC2007 as the harness's 13th dataset: parsed from the real VOC2007 folder layout, its two
published APs (VOC07 11-point and area) and the multi-label loss."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

from pretrain.utils.errors import DatasetError
from tests.helpers.classification import make_voc2007, voc_labels
from transfer.classification.linear import classification_loss
from transfer.classification.metrics import score
from transfer.classification.transfer_datasets import (
    ALL_DATASET_NAMES,
    DATASET_NAMES,
    build_transfer_dataset,
)
from transfer.classification.voc07 import VOC_CLASSES, voc07_ap11, voc_area_ap, voc_map


@pytest.fixture(scope="module")
def voc_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("voc") / "VOC2007")
    return root, make_voc2007(root)


def test_voc2007_parses_from_its_real_folder_layout(voc_root):
    """Proves: the official train / val / test lists, labels from Annotations/*.xml that agree
    with the per-class files (present 1, absent 0, only-difficult -1), and images that decode."""
    root, ids = voc_root
    data = build_transfer_dataset("voc2007", root)
    assert [data.split_size(s) for s in ("train", "val", "test")] == [30, 30, 20]
    assert data.sources["test"].ids == ids["test"] and data.metric == "map11"
    labels = data.labels["val"]
    for row, index in zip(labels, range(30, 60), strict=True):  # val images are 30..59
        planted = voc_labels(index)
        expected = [{"1": 1, "0": -1}.get(planted.get(c, ""), 0) for c in VOC_CLASSES]
        assert row.tolist() == expected
    assert (labels == -1).any() and (labels == 1).sum() == 2 * 30
    image, label = data.sources["train"][0]
    assert image.size == (16, 12) and label.shape == (20,)


def test_voc2007_is_the_13th_dataset_not_in_table2_default():
    assert "voc2007" in ALL_DATASET_NAMES and "voc2007" not in DATASET_NAMES
    assert len(ALL_DATASET_NAMES) == 13 and ALL_DATASET_NAMES["voc2007"] == "VOC2007"


def test_per_class_file_disagreeing_with_annotations_is_named(tmp_path):
    root = str(tmp_path / "VOC2007")
    make_voc2007(root, {"train": 2, "val": 2, "test": 2})
    path = os.path.join(root, "ImageSets", "Main", "aeroplane_val.txt")
    with open(path) as f:
        lines = f.read().splitlines()
    img, value = lines[0].split()
    lines[0] = f"{img} {'1' if value == '-1' else '-1'}"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="aeroplane_val.txt"):
        build_transfer_dataset("voc2007", root)


def test_missing_voc_folder_names_the_layout(tmp_path):
    (tmp_path / "Annotations").mkdir()
    with pytest.raises(DatasetError, match="JPEGImages"):
        build_transfer_dataset("voc2007", str(tmp_path))


def test_ap11_and_area_ap_hand_computed_with_difficult_left_out():
    """Ranking 1, 0, (difficult), 1: precisions 1, 1/2, 2/3 at recalls 1/2, 1/2, 1. The VOC07
    11-point AP is (6 x 1 + 5 x 2/3) / 11, the area AP 1/2 x 1 + 1/2 x 2/3; the difficult image,
    ranked third, changes neither."""
    scores = np.array([0.9, 0.8, 0.75, 0.7])
    labels = np.array([1, 0, -1, 1])
    assert voc07_ap11(scores, labels) == pytest.approx((6 + 5 * 2 / 3) / 11)
    assert voc_area_ap(scores, labels) == pytest.approx(0.5 + 0.5 * 2 / 3)
    keep = labels != -1  # scikit-learn's AP equals the area AP when precision never rises
    assert voc_area_ap(scores, labels) == pytest.approx(
        average_precision_score(labels[keep] == 1, scores[keep])
    )


def test_map11_score_of_a_perfect_and_a_reversed_ranking():
    labels = torch.tensor([[1, 0], [0, 1], [-1, 0], [0, 1]])
    perfect = torch.tensor([[5.0, 0.0], [0.0, 5.0], [9.0, 0.0], [0.0, 4.0]])
    assert score("map11", perfect, labels) == pytest.approx(1.0)
    assert voc_map(-perfect.numpy(), labels.numpy())[0] < 1.0
    assert score("map11", torch.full((4, 2), float("nan")), labels) < 1.0  # diverged: no crash


def test_multilabel_loss_leaves_difficult_entries_out():
    """The loss of (B, C) labels is the mean BCE of the known entries; a logit at a difficult
    entry does not change it. Class ids (B,) still get the cross-entropy."""
    labels = torch.tensor([[1, 0, -1], [0, -1, 1]])
    logits = torch.randn(2, 3)
    known = labels >= 0
    expected = F.binary_cross_entropy_with_logits(logits[known], labels[known].float())
    assert classification_loss(logits, labels) == pytest.approx(expected.item())
    moved = logits.clone()
    moved[~known] += 100.0
    assert classification_loss(moved, labels) == pytest.approx(expected.item())
    ids = torch.tensor([0, 2])
    assert classification_loss(logits, ids) == pytest.approx(F.cross_entropy(logits, ids).item())


def _linear_cfg(tmp_path, data_root: str, name: str):
    from tests.helpers import ROOT
    from transfer.classification.config import load_config, transfer_defaults

    opts = ["OUTPUT_DIR", str(tmp_path / "run"), "TRANSFER.DATA_ROOT", data_root]
    opts += ["FEATURES.CACHE_DIR", str(tmp_path / "cache"), "TRANSFER.DATASETS", "['voc2007']"]
    path = os.path.join(ROOT, "configs", "eval", "quick_schedules", name)
    return load_config(transfer_defaults(), path, opts)


def test_voc2007_runs_through_the_cached_linear_protocol_and_table2(tmp_path):
    """Proves VOC2007 is usable by the linear harness: multi-label heads are swept, selected by
    val 11-point mAP and scored on test, and Table 2 gains a VOC2007 column for that row."""
    from transfer.classification.backbone import load_eval_backbone
    from transfer.classification.transfer import run_transfer, write_tables

    make_voc2007(str(tmp_path / "data" / "voc2007"))
    cfg = _linear_cfg(tmp_path, str(tmp_path / "data"), "transfer_instant.yaml")
    (r,) = run_transfer(cfg, load_eval_backbone(random_init="resnet18"))
    assert (r.key, r.metric, r.num_classes) == ("voc2007", "map11", 20)
    assert len(r.val_scores) == 7 and all(0.0 < v <= 1.0 for v in r.val_scores)
    assert (r.n_train, r.n_val, r.n_test) == (30, 30, 20) and 0.0 < r.test_score <= 1.0
    md = write_tables(str(tmp_path / "tables"), "tiny", [r])
    with open(md) as f:
        header = f.read().splitlines()[2]
    assert "| VOC2007 |" in header and header.index("SUN397") < header.index("VOC2007")


@pytest.mark.protocols
def test_voc2007_runs_through_the_augmented_linear_protocol(tmp_path):
    """The augmented protocol trains multi-label heads on augmented VOC2007 images."""
    from transfer.classification.backbone import load_eval_backbone
    from transfer.classification.transfer import run_transfer

    make_voc2007(str(tmp_path / "data" / "voc2007"))
    cfg = _linear_cfg(tmp_path, str(tmp_path / "data"), "transfer_augmented_instant.yaml")
    (r,) = run_transfer(cfg, load_eval_backbone(random_init="resnet18"))
    assert r.protocol == "augmented" and r.metric == "map11" and 0.0 < r.test_score <= 1.0
