"""Fashion-MNIST idx reading, the one kNN and feature extractor, the kNN tool and the detectron2
KNNHook."""

from __future__ import annotations

import csv
import gzip
import json
import os
import struct

import numpy as np
import pytest
import torch
from detectron2.engine import SimpleTrainer, hooks
from detectron2.utils.events import JSONWriter
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pretrain.data.datasets import DatasetError, FashionMNISTSource, read_idx
from pretrain.evaluation.features import embed, extract_features, module_feature_fn
from pretrain.evaluation.knn import knn_accuracy, knn_top1
from pretrain.evaluation.knn_monitor import KNNHook
from tests.helpers.classification import (  # noqa: F401
    make_knn_fashion_mnist,
    single_thread,
    write_idx,
)
from transfer.cli import knn_eval

REAL_FMNIST = "/usr/share/datasets/fashion-mnist"


def test_read_idx_roundtrip_and_corruption(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for compress in (True, False):
        p = str(tmp_path / f"x{'.gz' if compress else ''}")
        write_idx(p, arr, compress)
        np.testing.assert_array_equal(read_idx(p), arr)
    with gzip.open(tmp_path / "bad.gz", "wb") as f:
        f.write(b"\x01\x02\x08\x01" + b"\0" * 8)
    with pytest.raises(DatasetError, match="bad.gz: not an idx file"):
        read_idx(str(tmp_path / "bad.gz"))
    with gzip.open(tmp_path / "short.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\0" * 3)
    with pytest.raises(DatasetError, match="short.gz: idx payload has 3 bytes"):
        read_idx(str(tmp_path / "short.gz"))


def test_fashion_mnist_dataset_is_rgb_at_requested_size(tmp_path):
    root = make_knn_fashion_mnist(str(tmp_path / "fm"))
    ds = FashionMNISTSource(root, "test", image_size=40)
    img, label = ds[3]
    assert img.mode == "RGB" and img.size == (40, 40) and label == 3 and len(ds) == 20
    r, g, b = (np.asarray(ch) for ch in img.split())
    assert np.array_equal(r, g) and np.array_equal(g, b)  # grey replicated


@pytest.mark.skipif(not os.path.isdir(REAL_FMNIST), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_files():
    labels = read_idx(os.path.join(REAL_FMNIST, "t10k-labels-idx1-ubyte.gz"))
    assert labels.shape == (10000,) and np.bincount(labels).tolist() == [1000] * 10
    ds = FashionMNISTSource(REAL_FMNIST, "test", 5, image_size=32)
    assert len(ds) == 5 and ds[0][0].size == (32, 32)


def test_knn_tool_on_fashion_mnist_layout(tmp_path):
    """Proves the kNN tool reads the idx layout, caches features and writes its table; the
    stripe classes are separable so even random conv features classify well above chance."""
    root = make_knn_fashion_mnist(str(tmp_path / "fm"))
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    argv = [
        "--random-init",
        "resnet18",
        "--dataset",
        "fashion-mnist",
        "--data-root",
        root,
        "--image-size",
        "32",
        "--k",
        "5",
        "--num-workers",
        "0",
        "--output-dir",
        out,
        "--cache-dir",
        cache,
        "--device",
        "cpu",
    ]
    knn_eval.main(argv)
    with open(os.path.join(out, "knn.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["fashion-mnist kNN top-1"]) > 50.0 and row["k"] == "5"
    assert len(os.listdir(cache)) == 2
    assert os.path.isfile(os.path.join(out, "args.json"))


class _Model(nn.Module):
    """A trainable toy 'pretraining' model: returns a loss dict, exposes a backbone."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.BatchNorm1d(8))

    def forward(self, batch):
        x, _ = batch
        return {"loss": self.backbone(x).pow(2).mean()}


def test_knn_hook_reports_every_period_and_at_end(tmp_path):
    """Proves the hook stores ``knn/top1`` at iterations period-1, 2*period-1, ... and after
    training (at max_iter, as detectron2's EvalHook), a PeriodicWriter registered after it
    writes all of them, the final value is kNN on the final features, and train mode is
    restored."""
    gen = torch.Generator().manual_seed(0)
    y_train, y_test = torch.arange(40) % 4, torch.arange(20) % 4
    x_train = torch.randn(40, 4, generator=gen) + 3 * nn.functional.one_hot(y_train, 4)
    x_test = torch.randn(20, 4, generator=gen) + 3 * nn.functional.one_hot(y_test, 4)
    train_loader = DataLoader(TensorDataset(x_train, y_train), batch_size=16)
    test_loader = DataLoader(TensorDataset(x_test, y_test), batch_size=16)
    model = _Model()
    feature_fn = module_feature_fn(model.backbone, "cpu")
    hook = KNNHook(2, feature_fn, train_loader, test_loader, num_classes=4, k=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = ((x_train[i : i + 8], y_train[i : i + 8]) for i in range(0, 40, 8))
    trainer = SimpleTrainer(model, batches, opt)
    metrics = str(tmp_path / "metrics.json")
    trainer.register_hooks([hook, hooks.PeriodicWriter([JSONWriter(metrics)], period=1)])
    trainer.train(0, 5)

    history = trainer.storage.history("knn/top1").values()
    assert [it for _, it in history] == [1, 3, 5]
    with open(metrics) as f:
        written = [json.loads(line) for line in f]
    assert [m["iteration"] for m in written if "knn/top1" in m] == [1, 3, 5]
    assert model.training and model.backbone.training
    model.backbone.eval()
    with torch.no_grad():
        expected = knn_accuracy(
            model.backbone(x_train), y_train, model.backbone(x_test), y_test, 4, 10
        )
    assert history[-1][0] == pytest.approx(expected) and hook.last_top1 == pytest.approx(expected)
    assert expected > 0.5


def test_knn_hook_validates_arguments():
    with pytest.raises(ValueError, match="period"):
        KNNHook(0, lambda x: x, [], [], 10)


def test_knn_top1_is_knn_accuracy_of_extracted_features():
    """Proves the one kNN entry point composes the one feature extractor and the one kNN (the
    class count inferred from the labels), with the model in eval and inference mode."""
    gen = torch.Generator().manual_seed(0)
    y_ref, y_test = torch.arange(30) % 3, torch.arange(12) % 3
    x_ref = torch.randn(30, 4, generator=gen) + 3 * nn.functional.one_hot(y_ref, 4)
    x_test = torch.randn(12, 4, generator=gen) + 3 * nn.functional.one_hot(y_test, 4)
    seen = []

    class Probe(nn.Linear):
        def forward(self, x):
            seen.append((self.training, torch.is_inference_mode_enabled()))
            return super().forward(x)

    model = Probe(4, 6)
    top1 = knn_top1(model, TensorDataset(x_ref, y_ref), TensorDataset(x_test, y_test), k=5)
    assert set(seen) == {(False, True)}
    with torch.no_grad():
        expected = knn_accuracy(model(x_ref), y_ref, model(x_test), y_test, 3, 5)
    assert top1 == pytest.approx(expected) and top1 > 0.5
    f, y = extract_features(model, TensorDataset(x_test, y_test), batch_size=5)
    assert f.shape == (12, 6) and f.dtype == torch.float32 and torch.equal(y, y_test)
    with pytest.raises(ValueError, match="empty set: no images"):
        embed(lambda x: x, [], desc="empty set")
