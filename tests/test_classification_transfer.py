"""The 12-dataset linear-transfer harness end to end on fake data, and its feature cache."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from test_classification_fakes import make_all, make_dtd, no_md5, single_thread  # noqa: F401
from torch import nn

from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import load_config, transfer_defaults
from transfer.classification.transfer import run_transfer, write_tables
from transfer.classification.transfer_datasets import DATASET_NAMES

INSTANT = os.path.join(os.path.dirname(__file__), "..", "configs", "eval", "quick_schedules")


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
