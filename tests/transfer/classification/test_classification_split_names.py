"""A SimCLR-style label-split file names images by file name: a listed name that several images
share (``img0.png`` in every class folder) is an error naming them, not a silent pick of the
first (3 labelled images instead of 30); unique names resolve to their one image."""

from __future__ import annotations

import os

import pytest

from pretrain.utils.errors import DatasetError
from tests.helpers import make_image_folder
from tests.helpers.classification import QUICK
from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import load_config, semi_supervised_defaults
from transfer.classification.datasets import build_image_folder, subset_indices
from transfer.classification.semi import run_semi_supervised


def test_a_shared_file_name_in_the_split_file_is_an_error_naming_the_images(tmp_path):
    data = tmp_path / "data"
    make_image_folder(data / "train", classes=3, per_class=10, size=16)  # img0..img9 per class
    make_image_folder(data / "val", classes=3, per_class=2, size=16)
    split = tmp_path / "10images.txt"
    split.write_text("".join(f"img{i}.{'jpg' if i % 2 else 'png'}\n" for i in range(10)))
    cfg = load_config(
        semi_supervised_defaults(),
        os.path.join(QUICK, "semi_instant.yaml"),
        ["OUTPUT_DIR", str(tmp_path / "o"), "DATA.SPLIT_FILE", str(split)],
    )
    backbone = load_eval_backbone(random_init="resnet18")
    with pytest.raises(DatasetError) as e:
        run_semi_supervised(cfg, backbone, str(data), "cpu")
    msg = str(e.value)
    assert msg.startswith(f"{split}: 10 listed file names are shared by several images")
    assert "'img0.png' is class0/img0.png, class1/img0.png, class2/img0.png" in msg


def test_unique_names_still_resolve_to_their_images(tmp_path):
    make_image_folder(tmp_path / "train", classes=3, per_class=2, size=16)
    (tmp_path / "train" / "class2" / "img0.png").rename(tmp_path / "train" / "class2" / "z.png")
    ds = build_image_folder(str(tmp_path / "train"))
    got = subset_indices(ds, ["z.png"])
    assert [os.path.relpath(ds.samples[i][0], ds.root) for i in got] == ["class2/z.png"]
