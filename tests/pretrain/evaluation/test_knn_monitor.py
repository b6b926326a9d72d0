"""TEST.KNN_PERIOD > 0: the kNN monitor runs inside pretraining and writes knn/top1."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from detectron2.utils.events import EventStorage

from pretrain.config import ConfigError, load_config
from pretrain.engine.trainer import PretrainTrainer
from pretrain.evaluation.knn_monitor import KNNHook
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
    # the collapse diagnostics of the same features are written with it (metrics.json)
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    diag = [r for r in rows if "knn/effective_rank" in r and "knn/uniformity" in r]
    assert [r["iteration"] for r in diag] == [1, 3, 6]
    assert all(r["knn/effective_rank"] >= 1 for r in diag)


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


def _monitor_run(feature_fn, caplog) -> dict[str, float]:
    """One evaluation of a KNNHook over 60 random references and 30 queries of 3 classes;
    the scalars it put into the event storage."""
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(90, 3, 4, 4, generator=g), torch.arange(90) % 3
    refs = [(images[i : i + 20], labels[i : i + 20]) for i in range(0, 60, 20)]
    queries = [(images[60:], labels[60:])]
    hook = KNNHook(1, feature_fn, refs, queries, num_classes=3, k=5)
    with EventStorage(0) as storage, caplog.at_level(logging.INFO, "pretrain.evaluation"):
        hook.trainer = SimpleNamespace(storage=storage, iter=0, max_iter=1)
        hook.after_train()
        return {k: v for k, (v, _) in storage.latest().items()}


def test_monitor_logs_collapse_diagnostics_and_warns_on_a_collapsed_model(caplog):
    values = _monitor_run(lambda x: torch.ones(len(x), 16), caplog)  # a constant embedding
    for key in ("knn/top1", "knn/effective_rank", "knn/std", "knn/alignment", "knn/uniformity"):
        assert key in values, key
    assert values["knn/effective_rank"] == 0.0 and values["knn/std"] == pytest.approx(0, abs=1e-7)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "collapsed" in warnings[0].getMessage(), caplog.text


def test_monitor_does_not_warn_on_a_healthy_model(caplog):
    proj = torch.randn(48, 16, generator=torch.Generator().manual_seed(1))
    values = _monitor_run(lambda x: x.flatten(1) @ proj, caplog)  # random, full-rank features
    assert values["knn/effective_rank"] > 10 and values["knn/std_ratio"] > 0.5
    assert 0 < values["knn/alignment"] <= 4 and values["knn/uniformity"] < 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "effective rank" in caplog.text  # the info line with the numbers
