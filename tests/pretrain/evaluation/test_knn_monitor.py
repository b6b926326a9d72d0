"""TEST.KNN_PERIOD > 0: the kNN monitor runs inside pretraining and writes knn/top1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrain.config import ConfigError, load_config
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.classification import make_knn_fashion_mnist
from transfer.classification.demo import DEMO_CONFIG


def _knn_records(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    return [(r["iteration"], r["knn/top1"]) for r in rows if "knn/top1" in r]


KNN = {
    "TEST.KNN_PERIOD": 2,
    "TEST.KNN_TRAIN_IMAGES": 40,
    "TEST.KNN_TEST_IMAGES": 20,
    "TEST.KNN_K": 5,
    "SOLVER.MAX_ITER": 6,
}


def test_fashion_mnist_pretraining_writes_knn_every_period_and_at_the_end(tmp_path):
    root = make_knn_fashion_mnist(str(tmp_path / "fmnist"), n_train=64, n_test=20)
    out = tmp_path / "run"
    opts = tiny_opts(root, out, **{"DATASETS.TYPE": "fashion_mnist", **KNN})
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    trainer.train()
    records = _knn_records(out)
    # after iterations 2 and 4 (period 2, storage index 1 and 3), and after training (stored at
    # max_iter, as detectron2's EvalHook does)
    assert [it for it, _ in records] == [1, 3, 6], records
    assert all(0.0 <= top1 <= 1.0 for _, top1 in records)
    # 20 test images of 10 classes: a kNN that never ran or always failed would not vary or
    # would be 0; the test split is used (20 queries), so top-1 is a multiple of 1/20
    assert all(abs(top1 * 20 - round(top1 * 20)) < 1e-6 for _, top1 in records)


def test_imagefolder_monitor_reads_the_labelled_root(tmp_path):
    data = make_image_folder(tmp_path / "data", classes=2, per_class=12)
    labelled = tmp_path / "labelled"
    make_image_folder(labelled / "train", classes=2, per_class=6)
    make_image_folder(labelled / "val", classes=2, per_class=3)
    out = tmp_path / "run"
    opts = tiny_opts(data, out, **{**KNN, "TEST.KNN_ROOT": str(labelled), "TEST.KNN_K": 3})
    PretrainTrainer(load_config(DEMO_CONFIG, opts)).train()
    records = _knn_records(out)
    assert len(records) == 3
    assert all(abs(top1 * 6 - round(top1 * 6)) < 1e-6 for _, top1 in records)  # 6 val images


def test_imagefolder_monitor_without_a_labelled_root_is_refused(tmp_path, image_folder):
    with pytest.raises(ConfigError, match="TEST.KNN_ROOT"):
        load_config(DEMO_CONFIG, tiny_opts(image_folder, tmp_path / "o", **KNN))
    opts = tiny_opts(image_folder, tmp_path / "o", **{**KNN, "TEST.KNN_ROOT": str(tmp_path)})
    with pytest.raises(ConfigError, match="TEST.KNN_ROOT.*no train/"):
        PretrainTrainer(load_config(DEMO_CONFIG, opts))
