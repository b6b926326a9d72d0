"""``TRANSFER.PROTOCOL finetune``: the published search grid and its selection on a planted
problem (cheap), and the whole protocol on tiny datasets in their real layouts (protocols)."""

from __future__ import annotations

import csv
import math
import os

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.classification import make_dtd, make_voc2007, single_thread  # noqa: F401
from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import load_config, transfer_defaults
from transfer.classification.finetune import (
    FineTuning,
    SearchPoint,
    bn_momentum,
    finetune_search,
    search_grid,
)
from transfer.classification.transfer import run_transfer, write_tables
from transfer.classification.transfer_datasets import build_transfer_dataset

CONFIGS = os.path.join(ROOT, "configs", "eval")


def _cfg(name: str, *opts: str):
    return load_config(transfer_defaults(), os.path.join(CONFIGS, name), list(opts))


def test_search_grid_is_simclrs_7_lrs_by_no_wd_and_7_wds_over_lr():
    points = search_grid(_cfg("transfer_finetune.yaml"))
    assert len(points) == 56
    lrs = sorted({p.lr for p in points})
    assert lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(0.1) and len(lrs) == 7
    first = [p for p in points if p.lr == lrs[0]]
    assert first[0].wd == 0.0
    assert [p.wd * p.lr for p in first[1:]] == pytest.approx([10 ** (-6 + i / 2) for i in range(7)])


def test_search_picks_the_documented_best_point_on_a_planted_problem():
    """A stub trainer whose val score peaks at lr 0.01 and weight decay 1e-4 / lr: the search
    picks that point; where two points tie, the earlier of the grid (smaller lr, then smaller
    weight decay) wins, as docs/evaluation.md says."""
    points = search_grid(_cfg("transfer_finetune.yaml"))
    target = SearchPoint(0.01, 1e-4 / 0.01)

    def planted(p: SearchPoint) -> float:
        wd = math.log10(p.wd * p.lr) if p.wd else -8.0
        return -abs(math.log10(p.lr) + 2) - abs(wd + 4)

    scores, best = finetune_search(points, planted)
    assert points[best].lr == pytest.approx(target.lr)
    assert points[best].wd == pytest.approx(target.wd)
    assert len(scores) == 56
    _, tie = finetune_search(points, lambda p: 1.0 if p.lr >= 0.01 else 0.0)
    assert points[tie].lr == pytest.approx(0.01) and points[tie].wd == 0.0


def test_bn_momentum_is_simclrs_max_1_minus_10_over_s_09():
    assert bn_momentum(50) == pytest.approx(0.1)  # decay max(0.8, 0.9) = 0.9
    assert bn_momentum(1000) == pytest.approx(0.01)  # decay 0.99


@pytest.mark.protocols
def test_finetune_changes_every_backbone_parameter_fills_its_table_and_resumes(
    tmp_path, monkeypatch
):
    """Proves: a fine-tuning run changes every backbone parameter (the whole network trains),
    the protocol runs search -> select -> retrain -> test on DTD and VOC2007 (multi-label) and
    fills its table beside the published supervised row, and a second run in the same output
    directory reads every finished dataset back without training."""
    data_root = tmp_path / "data"
    make_dtd(str(data_root / "dtd"))
    make_voc2007(str(data_root / "voc2007"), {"train": 20, "val": 20, "test": 20})
    out = str(tmp_path / "run")
    cfg = _cfg(
        "quick_schedules/transfer_finetune_instant.yaml",
        "OUTPUT_DIR", out, "TRANSFER.DATA_ROOT", str(data_root),
        "TRANSFER.DATASETS", "['dtd', 'voc2007']",
    )  # fmt: skip
    backbone = load_eval_backbone(random_init="resnet18")
    before = {n: p.detach().clone() for n, p in backbone.model.named_parameters()}

    dtd = build_transfer_dataset("dtd", str(data_root / "dtd"))
    point = SearchPoint(0.1, 0.0)
    model = FineTuning(dtd, backbone, cfg, "cpu").fine_tune(["train"], point, str(tmp_path / "p"))
    after = dict(model.backbone.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n].detach())]
    assert not unchanged, f"not trained: {unchanged}"
    kept = dict(backbone.model.named_parameters())  # the pretrained weights stay as they were
    assert all(torch.equal(p, kept[n]) for n, p in before.items())

    results = run_transfer(cfg, backbone)
    assert [r.key for r in results] == ["dtd", "voc2007"]
    for r in results:
        assert r.protocol == "finetune" and len(r.val_scores) == 4 and len(r.wds) == 4
        assert (r.best_lr, r.best_wd) in zip(
            r.lrs, r.wds, strict=True
        ) and 0.0 <= r.test_score <= 1.0
    assert results[1].metric == "map11"
    md = write_tables(str(tmp_path / "tables"), "tiny", results, comparable="no: test run")
    with open(os.path.splitext(md)[0] + ".csv") as f:
        rows = {r["Model"]: r for r in csv.DictReader(f)}
    mine = rows["tiny"]
    assert mine["DTD"] and mine["VOC2007"] and mine["Protocol"] == "finetune"
    published = rows["Supervised IN-1K ResNet-50 (published)"]
    assert published["VOC2007"] == "85.00" and "BYOL" in published["Reference"]

    def refuse(*args, **kwargs):
        raise AssertionError("a finished dataset was trained again")

    monkeypatch.setattr(FineTuning, "point_score", refuse)  # what a finished dataset must not reach
    again = run_transfer(cfg, backbone, resume=True)
    assert [r.test_score for r in again] == [r.test_score for r in results]


@pytest.mark.protocols
def test_an_interrupted_search_keeps_its_finished_points(tmp_path, monkeypatch):
    """Proves per-point resume: points whose point.json exists are read back, only the
    missing ones are trained (the output directory of an interrupted dataset)."""
    make_dtd(str(tmp_path / "dtd"))
    cfg = _cfg(
        "quick_schedules/transfer_finetune_instant.yaml",
        "OUTPUT_DIR", str(tmp_path / "run"), "TRANSFER.DATA_ROOT", str(tmp_path),
        "TRANSFER.DATASETS", "['dtd']",
    )  # fmt: skip
    backbone = load_eval_backbone(random_init="resnet18")
    first = run_transfer(cfg, backbone)[0]
    os.remove(os.path.join(str(tmp_path / "run"), "datasets", "dtd.json"))
    lost = search_grid(cfg)[2]
    os.remove(os.path.join(str(tmp_path / "run"), "finetune", "dtd", lost.tag, "point.json"))
    trained = []
    real = FineTuning.fine_tune

    def counting(self, splits, point, out):
        trained.append(point)
        return real(self, splits, point, out)

    monkeypatch.setattr(FineTuning, "fine_tune", counting)
    again = run_transfer(cfg, backbone, resume=True)[0]
    assert trained == [lost]
    assert again.val_scores[:2] == first.val_scores[:2] and again.test_score == first.test_score
