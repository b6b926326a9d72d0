"""The demo reads an image folder as the other tools do: ``<root>`` with ``train/`` and ``val/``
(the evaluation tools' ``--data-root``) pretrains on ``train/`` and reports kNN of ``val/`` against
``train/``; a folder of class folders (pretraining's ``DATASETS.ROOT``) holds every 5th image out;
anything in between is refused in one line; and the report's header gives the numbers of images
really used."""

from __future__ import annotations

import pytest
import yaml

from pretrain.utils.errors import DatasetError
from tests.helpers import make_image_folder, tiny_opts
from transfer.classification.demo import (
    CLASS_ROOT,
    SPLIT_ROOT,
    demo_folder_layout,
    run_demo,
)


def _split_root(root):
    make_image_folder(root / "train", classes=2, per_class=6, size=24)
    make_image_folder(root / "val", classes=2, per_class=3, size=24)
    return root


def test_layouts_and_the_ambiguous_ones(tmp_path):
    assert demo_folder_layout(str(_split_root(tmp_path / "split"))) == SPLIT_ROOT
    classes = make_image_folder(tmp_path / "classes", classes=2, per_class=2, size=16)
    assert demo_folder_layout(str(classes)) == CLASS_ROOT
    only_train = make_image_folder(tmp_path / "half" / "train", classes=1, per_class=1, size=16)
    with pytest.raises(DatasetError, match="has train/ but no val/"):
        demo_folder_layout(str(only_train.parent))
    extra = _split_root(tmp_path / "extra")
    (extra / "test").mkdir()
    with pytest.raises(DatasetError, match=r"beside other folders \(test\)"):
        demo_folder_layout(str(extra))
    with pytest.raises(DatasetError, match="no such directory"):
        demo_folder_layout(str(tmp_path / "nowhere"))


def test_a_train_val_root_pretrains_on_train_and_reports_the_numbers_used(tmp_path):
    root, out = _split_root(tmp_path / "data"), tmp_path / "demo"
    opts = tiny_opts(root, out, **{"SOLVER.MAX_ITER": 2, "SOLVER.IMS_PER_BATCH": 4})
    opts = [o for o in opts if o not in ("OUTPUT_DIR", str(out))]
    res = run_demo(str(out), opts, n_train=10000, n_test=10000)
    # 12 references (train/, 2 classes x 6) and 6 queries (val/), whatever was asked for
    assert res.header.startswith(f"kNN top-1 on 6 images of {root / 'val'} (")
    assert res.header.endswith(", 12 references):")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["DATASETS"]["ROOT"] == str(root / "train")  # pretraining never saw val/
    for acc in (res.knn_pretrained, res.knn_random, res.knn_raw_pixels):
        assert acc * 6 == pytest.approx(round(acc * 6))  # a fraction of the 6 val images


def test_an_ambiguous_root_is_refused_before_anything_is_written(tmp_path):
    root, out = _split_root(tmp_path / "data"), tmp_path / "demo"
    (root / "test").mkdir()
    opts = [o for o in tiny_opts(root, out) if o not in ("OUTPUT_DIR", str(out))]
    with pytest.raises(DatasetError, match="beside other folders"):
        run_demo(str(out), opts)
    assert not out.exists()
