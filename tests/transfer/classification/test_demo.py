"""The demo's pieces: the raw-pixel baseline, the small ResNet stem, the printed report."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pretrain.config import ConfigError, load_config
from pretrain.modeling import build_model
from pretrain.modeling.encoder import resnet_backbone
from tests.helpers.classification import make_knn_fashion_mnist
from transfer.checkpoint.reader import build_torchvision_backbone, extract_backbone
from transfer.classification.demo import (
    DEMO_CONFIG,
    DemoResult,
    centred_pixels,
    format_knn_report,
    format_training_summary,
    method_label,
    raw_pixel_top1,
)
from transfer.detection.convert import ConversionError, convert_to_d2


def _plain_centred_knn(train_x, train_y, test_x, test_y, k, t, classes) -> float:
    """Weighted kNN written out per test image, on pixel vectors centred by the train mean."""
    mean = train_x.mean(axis=0)
    a, b = train_x - mean, test_x - mean
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    correct = 0
    for x, y in zip(b, test_y, strict=True):
        sim = a @ (x / np.linalg.norm(x))
        votes = np.zeros(classes)
        for j in np.argsort(-sim)[:k]:
            votes[train_y[j]] += math.exp(sim[j] / t)
        correct += int(votes.argmax() == y)
    return correct / len(test_y)


def test_raw_pixel_baseline_equals_a_plain_centred_knn(tmp_path):
    """raw_pixel_top1 reads the 28x28 grey images and equals a plainly written centred kNN; k is
    the default 200, so every reference votes and the exp(s / T) weights decide."""
    from pretrain.data.datasets import read_idx

    root = make_knn_fashion_mnist(str(tmp_path / "fm"), n_train=40, n_test=30)
    images = {p: read_idx(f"{root}/{p}-images-idx3-ubyte.gz") for p in ("train", "t10k")}
    labels = {p: read_idx(f"{root}/{p}-labels-idx1-ubyte.gz") for p in ("train", "t10k")}
    x_tr = images["train"].reshape(40, -1).astype(np.float64) / 255.0
    x_te = images["t10k"].reshape(30, -1).astype(np.float64) / 255.0
    expected = _plain_centred_knn(x_tr, labels["train"], x_te, labels["t10k"], 200, 0.07, 10)
    got = raw_pixel_top1(root, n_train=40, n_test=30)
    assert got == pytest.approx(expected)
    assert got > 0.5  # the stripes are pixel-separable: a broken baseline would be near 10 %


def test_centred_pixels_subtracts_the_reference_mean():
    train = torch.arange(24.0).reshape(3, 2, 2, 2)
    test = torch.ones(2, 2, 2, 2)
    f_train, f_test = centred_pixels(train, test)
    mean = train.reshape(3, -1).mean(0)
    assert f_train.shape == (3, 8) and f_test.shape == (2, 8)
    torch.testing.assert_close(f_train.mean(0), torch.zeros(8))
    torch.testing.assert_close(f_test, torch.ones(2, 8) - mean)


def test_small_stem_keeps_the_resolution():
    """The small stem (3x3 stride 1, no max-pool) leaves a 28 px input 4x4 in the last stage."""
    net, dim = resnet_backbone("resnet18", "small")
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    x = torch.randn(2, 3, 28, 28)
    trunk = torch.nn.Sequential(*list(net.children())[:-2])  # up to layer4
    assert trunk(x).shape == (2, 512, 4, 4)
    assert net(x).shape == (2, dim) == (2, 512)
    with pytest.raises(ValueError, match="MODEL.STEM"):
        resnet_backbone("resnet18", "tiny")


def _small_stem_cfg(tmp_path):
    # Contiguous weights, so the round trip can be compared bit for bit (channels-last convs
    # sum in another order: differences of ~1e-6).
    opts = ["MODEL.STEM", "small", "MODEL.DEVICE", "cpu", "DATASETS.ROOT", str(tmp_path)]
    opts += ["MODEL.CHANNELS_LAST", "False"]
    return load_config(DEMO_CONFIG, opts)


def test_small_stem_checkpoint_round_trip_gives_identical_features(tmp_path):
    """A small-stem model's checkpoint loads as a torchvision ResNet with the same stem (read off
    conv1's kernel) and the same features; both encoders get the stem, the key one frozen."""
    model = build_model(_small_stem_cfg(tmp_path))
    for enc in (model.encoder_q, model.encoder_k):
        assert enc.backbone.conv1.weight.shape == (64, 3, 3, 3)
        assert isinstance(enc.backbone.maxpool, torch.nn.Identity)
    torch.testing.assert_close(
        model.encoder_q.backbone.conv1.weight, model.encoder_k.backbone.conv1.weight
    )
    assert not model.encoder_k.backbone.conv1.weight.requires_grad
    weights = extract_backbone({"model": model.state_dict()})
    assert weights.stem == "small" and weights.arch == "resnet18"
    tv = build_torchvision_backbone(weights).eval()
    ours = model.encoder_q.backbone.eval()
    x = torch.randn(4, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(tv(x), ours(x), rtol=0, atol=0)
    with pytest.raises(ConversionError, match="not converted to detectron2.*7x7"):
        convert_to_d2(weights)


def test_imagenet_stem_checkpoint_still_reads_as_imagenet(tmp_path):
    cfg = load_config(DEMO_CONFIG, ["MODEL.STEM", "imagenet", "DATASETS.ROOT", str(tmp_path)])
    weights = extract_backbone({"model": build_model(cfg).state_dict()})
    assert weights.stem == "imagenet"
    assert "stem.conv1.weight" in convert_to_d2(weights)


def test_stem_key_is_strict(tmp_path):
    with pytest.raises(ConfigError, match="MODEL.STEM"):
        load_config(DEMO_CONFIG, ["MODEL.STEM", "cifar", "DATASETS.ROOT", str(tmp_path)])


def test_method_label_names_what_the_config_trains(tmp_path):
    base = ["DATASETS.ROOT", str(tmp_path)]
    assert method_label(load_config(DEMO_CONFIG, base)) == "LORAC"
    assert method_label(load_config(DEMO_CONFIG, base + ["LOSS.PRIOR", "none"])) == "MoCo-M"
    assert method_label(load_config(DEMO_CONFIG, base + ["LOSS.BETA", "1e999"])) == "MoCo-M"
    v2 = ["LOSS.PRIOR", "none", "INPUT.LARGE_CROPS", "2", "INPUT.SMALL_CROPS", "0"]
    v2 += ["INPUT.KEY_CROPS", "1"]
    assert method_label(load_config(DEMO_CONFIG, base + v2)) == "MoCo-v2"


def test_report_is_the_four_documented_lines():
    res = DemoResult(
        checkpoint="x",
        knn_pretrained=0.85123,
        knn_random=0.7357,
        train_seconds=1.0,
        knn_raw_pixels=0.79584,
        header="kNN top-1 on the Fashion-MNIST test split (k = 200, T = 0.07, 10,000 references):",
    )
    assert format_knn_report(res).splitlines() == [
        "kNN top-1 on the Fashion-MNIST test split (k = 200, T = 0.07, 10,000 references):",
        "  raw pixels     79.58 %",
        "  random init    73.57 %",
        "  LORAC          85.12 %",
    ]


def test_the_summary_counts_what_this_run_trained_after_a_resume(tmp_path, monkeypatch):
    """The demo's ``pretraining:`` line, from the tool down to the trainer's ``start_iter``:
    pretraining itself stands in (a run resumed at iteration 400 of 1755 that writes its final
    checkpoint), everything after it is the demo's own."""
    from types import SimpleNamespace

    import pretrain.engine.run
    from tests.helpers import make_image_folder, tiny_opts
    from tests.helpers.mistakes import run_main
    from transfer.cli import demo

    root, out = make_image_folder(tmp_path / "images", classes=2, per_class=5, size=16), tmp_path
    # the small stem: no detectron2 conversion, which the line does not depend on
    opts = tiny_opts(root, out / "demo", **{"DATASETS.TYPE": "imagefolder", "MODEL.STEM": "small"})

    def resumed(cfg, **kwargs):
        torch.save({"model": build_model(cfg).state_dict()}, out / "demo" / "model_final.pth")
        return SimpleNamespace(start_iter=400, max_iter=1755)

    monkeypatch.setattr(pretrain.engine.run, "run_pretraining", resumed)
    argv = ["--output-dir", str(out / "demo"), "--knn-train", "4", "--knn-test", "2", *opts]
    result = run_main(demo.main, argv)
    assert result.returncode == 0, result.output
    assert "pretraining: 1355 of 1755 iterations in 0.0 min (400 done before)" in result.stdout


def test_the_summary_of_a_rerun_says_it_was_already_finished_and_of_a_fresh_run_its_time():
    def line(start: int) -> str:
        res = DemoResult("x", 0.8, 0.7, 90.0, iterations=1755, start_iteration=start)
        return format_training_summary(res)

    assert line(0) == "pretraining: 1755 iterations in 1.5 min"
    assert (
        line(1755) == "pretraining: already finished (1755 iterations), nothing trained this time"
    )
