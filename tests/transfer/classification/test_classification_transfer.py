"""The 12-dataset linear-transfer harness end to end on fake data, and its feature cache."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from torch import nn

from tests.helpers import ROOT
from tests.helpers.classification import make_all, make_dtd, no_md5, single_thread  # noqa: F401
from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import load_config, transfer_defaults
from transfer.classification.transfer import run_transfer, write_tables
from transfer.classification.transfer_datasets import DATASET_NAMES

INSTANT = os.path.join(ROOT, "configs", "eval", "quick_schedules")


class CountingBackbone(nn.Module):
    """Counts the images the wrapped backbone sees."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.images = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.images += x.shape[0]
        return self.inner(x)


def _cfg(out: str, data_root: str, cache: str, datasets=None, extra=()):
    opts = ["OUTPUT_DIR", out, "TRANSFER.DATA_ROOT", data_root, "FEATURES.CACHE_DIR", cache]
    opts += list(extra)
    if datasets:
        opts += ["TRANSFER.DATASETS", str(datasets)]
    return load_config(transfer_defaults(), os.path.join(INSTANT, "transfer_instant.yaml"), opts)


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer12")
    return str(root), make_all(str(root))


def test_12_datasets_end_to_end_one_backbone_pass_per_image(fake_root, no_md5, tmp_path):  # noqa: F811
    """Proves: all 12 datasets run through sweep -> select -> retrain -> test, the 7-lr sweep
    and the final retraining cost exactly one backbone pass per image of every split, a second
    run reads everything from the cache (zero passes) with identical results, and the tables,
    bar chart and details are written with one row per model."""
    root, expected = fake_root
    backbone = load_eval_backbone(random_init="resnet18")
    counter = CountingBackbone(backbone.model)
    backbone.model = counter
    cfg = _cfg(str(tmp_path / "run1"), root, str(tmp_path / "cache"))
    results = run_transfer(cfg, backbone)

    assert [r.key for r in results] == list(DATASET_NAMES)
    assert counter.images == sum(e["images"] for e in expected.values())
    for r in results:
        assert len(r.lrs) == 7 and len(r.val_scores) == 7
        assert r.lrs[0] == pytest.approx(0.1) and r.lrs[-1] == pytest.approx(100.0)
        assert r.best_lr in r.lrs and 0.0 <= r.test_score <= 1.0
        exp = expected[r.key]
        assert (r.n_train, r.n_val, r.n_test) == (exp["train"], exp["val"], exp["test"])
    metrics = {r.key: r.metric for r in results}
    assert {k for k, m in metrics.items() if m == "mean_per_class"} == {
        "aircraft",
        "caltech101",
        "flowers",
        "pets",
    }
    assert next(r for r in results if r.key == "places365").iters_sweep == 2  # 1 epoch of 12/8

    counter.images = 0
    again = run_transfer(_cfg(str(tmp_path / "run2"), root, str(tmp_path / "cache")), backbone)
    assert counter.images == 0
    assert [r.test_score for r in again] == [r.test_score for r in results]

    tables = tmp_path / "tables"
    write_tables(str(tables), "random R18", results)
    write_tables(str(tables), "random R18 again", again)
    with open(tables / "table2_transfer.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["Model"] for r in rows] == ["random R18", "random R18 again"]
    names = list(DATASET_NAMES.values())
    assert all(rows[0][n] for n in names) and rows[0]["n_datasets"] == "12"
    avg = sum(float(rows[0][n]) for n in names) / 12
    assert float(rows[0]["Average"]) == pytest.approx(avg, abs=0.01)
    assert (tables / "table2_transfer.md").read_text().count("| random R18") == 2
    assert (tables / "table2_transfer.png").stat().st_size > 1000
    with open(tables / "transfer_details.csv") as f:
        details = list(csv.DictReader(f))
    assert len(details) == 24 and len(details[0]["lrs"].split()) == 7


def test_cache_key_changes_with_transform_and_backbone(tmp_path):
    """Proves the cache is keyed by transform and backbone: another crop size or another
    backbone recomputes instead of reading stale features; the same ones hit the cache."""
    make_dtd(str(tmp_path / "data" / "dtd"))
    cache, data = str(tmp_path / "cache"), str(tmp_path / "data")
    counters = []
    for seed, crop, expect_new in ((0, 32, 18), (0, 32, 0), (0, 24, 18), (1, 32, 18)):
        backbone = load_eval_backbone(random_init="resnet18", seed=seed)
        backbone.model = CountingBackbone(backbone.model)
        cfg = _cfg(str(tmp_path / "o"), data, cache, ["dtd"], ["INPUT.CROP", str(crop)])
        run_transfer(cfg, backbone)
        counters.append(backbone.model.images)
        assert backbone.model.images == expect_new, (seed, crop)
    assert len(os.listdir(cache)) == 3 * 3  # 3 (backbone, transform) pairs x 3 DTD splits


class RecordingBackbone(CountingBackbone):
    """Also keeps the inputs of the classifier-training passes (those outside inference mode;
    feature extraction runs in inference mode)."""

    def __init__(self, inner: nn.Module):
        super().__init__(inner)
        self.train_batches: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_inference_mode_enabled():
            self.train_batches.append(x.clone())
        return super().forward(x)


def _augmented_cfg(out: str, data_root: str, cache: str, datasets):
    opts = ["OUTPUT_DIR", out, "TRANSFER.DATA_ROOT", data_root, "FEATURES.CACHE_DIR", cache]
    opts += ["TRANSFER.DATASETS", str(datasets)]
    path = os.path.join(INSTANT, "transfer_augmented_instant.yaml")
    return load_config(transfer_defaults(), path, opts)


def test_augmented_protocol_end_to_end_without_cache(fake_root, no_md5, tmp_path):  # noqa: F811
    """Proves: the augmented protocol runs sweep -> select -> retrain -> test, writes no feature
    cache, pays one backbone pass per training image drawn at every step (sweep and final run;
    the 7 heads share each pass) plus one per val and test image, and its results go to the
    same tables as the cached protocol's, in their own row with the protocol recorded."""
    root, expected = fake_root
    backbone = load_eval_backbone(random_init="resnet18")
    backbone.model = CountingBackbone(backbone.model)
    cache = tmp_path / "cache"
    cfg = _augmented_cfg(str(tmp_path / "aug"), root, str(cache), ["dtd", "cifar10"])
    results = run_transfer(cfg, backbone)

    assert not cache.exists()
    assert not list(tmp_path.rglob("*.pt"))
    passes = 0
    for r in results:
        exp = expected[r.key]
        assert r.protocol == "augmented"
        assert (r.n_train, r.n_val, r.n_test) == (exp["train"], exp["val"], exp["test"])
        assert len(r.val_scores) == 7 and r.best_lr in r.lrs and 0.0 <= r.test_score <= 1.0
        assert (r.iters_sweep, r.iters_final) == (5, 5)
        # Batches of 8 without a partial last one, or the whole split when it is smaller.
        passes += 5 * min(8, r.n_train) + 5 * min(8, r.n_train + r.n_val) + r.n_val + r.n_test
    assert backbone.model.images == passes == (30 + 40 + 12) + (40 + 40 + 20)

    cached_backbone = load_eval_backbone(random_init="resnet18")
    cached_cfg = _cfg(str(tmp_path / "cached"), root, str(cache), ["dtd", "cifar10"])
    cached = run_transfer(cached_cfg, cached_backbone)
    tables = tmp_path / "tables"
    write_tables(str(tables), "R18", cached)
    write_tables(str(tables), "R18", results)
    with open(tables / "table2_transfer.csv") as f:
        rows = {r["Model"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"R18", "R18 (augmented)"}
    assert rows["R18"]["Protocol"] == "cached_features"
    assert rows["R18 (augmented)"]["Protocol"] == "augmented"
    assert rows["R18 (augmented)"]["DTD"] == f"{100 * results[0].test_score:.2f}"
    with open(tables / "transfer_details.csv") as f:
        details = {r["run"]: r["protocol"] for r in csv.DictReader(f)}
    assert details["R18 (augmented)/dtd"] == "augmented" and details["R18/dtd"] == "cached_features"


def test_augmented_protocol_trains_on_random_resized_crops(tmp_path):
    """Proves the classifiers of the augmented protocol see augmented images: no training input
    is the centre crop of any image (as it would be with the evaluation pipeline), and the
    inputs of two epochs over the same images differ. In the instant sweep every step is one
    epoch over DTD's 6 training images (batch 8 > 6)."""
    from transfer.classification.transfer_datasets import BuildContext, build_transfer_dataset
    from transfer.classification.transforms import eval_transform

    make_dtd(str(tmp_path / "data" / "dtd"))
    backbone = load_eval_backbone(random_init="resnet18")
    backbone.model = RecordingBackbone(backbone.model)
    cfg = _augmented_cfg(str(tmp_path / "o"), str(tmp_path / "data"), str(tmp_path / "c"), ["dtd"])
    run_transfer(cfg, backbone)

    data = build_transfer_dataset("dtd", str(tmp_path / "data" / "dtd"), BuildContext())
    centre = eval_transform(cfg.INPUT.RESIZE, cfg.INPUT.CROP)
    crops = [centre(img) for src in data.sources.values() for img, _ in src]
    sweep = backbone.model.train_batches[:5]  # then 5 steps of the final train+val run
    assert len(backbone.model.train_batches) == 10
    assert all(b.shape == (6, 3, 32, 32) for b in sweep)
    seen = torch.cat(backbone.model.train_batches)
    assert not any(torch.equal(x, c) for x in seen for c in crops)

    def epoch(batch: torch.Tensor) -> torch.Tensor:  # the epoch's images, order-free
        return batch[batch.flatten(1).sum(1).argsort()]

    assert not torch.equal(epoch(sweep[0]), epoch(sweep[1]))
