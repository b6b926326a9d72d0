"""The model is encoders + queues + loss: the data path augments, the batch carries the seeds.

The random stream of a whole run (crops, colours, ShuffleBN) is pinned end to end by the resume
tests (test_pretrain_engine.py, test_cluster_signals.py) and the 1 vs 2 process tests
(test_cluster_distributed.py); here the model's side of the contract.
"""

from __future__ import annotations

import ast

import pytest
import torch

from pretrain.config.defaults import load_config
from pretrain.data.loader import (
    augment_views_on_device,
    build_batch_augment,
    collate_views,
    shuffle_seeds,
)
from pretrain.modeling import build_model
from tests.helpers import ROOT
from transfer.classification.demo import DEMO_CONFIG


def _tiny(**extra) -> tuple:
    opts = {"MODEL.HEAD_HIDDEN_DIM": 16, "MODEL.HEAD_OUT_DIM": 8, "MODEL.QUEUE_SIZE": 8,
            "SOLVER.IMS_PER_BATCH": 8, "DATASETS.ROOT": "/x", **extra}  # fmt: skip
    cfg = load_config(DEMO_CONFIG, [str(x) for kv in opts.items() for x in kv])
    model = build_model(cfg)
    views = [torch.randint(0, 256, (8, 3, s, s), dtype=torch.uint8) for s in model.view_sizes]
    return cfg, model, {"views": views, "seeds": torch.arange(8), "iteration": 3}


def test_modeling_imports_nothing_from_the_data_path():
    for path in sorted((ROOT / "pretrain" / "modeling").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.startswith("pretrain.data")], path.name


def test_model_rejects_views_the_data_path_did_not_finish():
    cfg, model, batch = _tiny()
    with pytest.raises(ValueError, match="augment_views_on_device"):
        model(batch)
    batch = augment_views_on_device(batch, build_batch_augment(cfg), "cpu", apply_color=True)
    assert all(v.dtype == torch.float32 for v in batch["views"])
    assert torch.isfinite(model(batch)["loss_contrastive"])


def test_shufflebn_takes_its_seeds_from_the_batch():
    """With two key BN groups the permutation comes from batch["shuffle_seeds"]: another seed
    gives other keys (BN statistics over other groups), the same seed the same keys."""
    cfg, model, batch = _tiny(**{"MODEL.KEY_BN_SPLITS": 2})
    batch = augment_views_on_device(batch, build_batch_augment(cfg), "cpu", apply_color=True)
    model.eval()  # no enqueue: both forwards see the same queue
    model.encoder_k.train()  # BN in training mode, as in real steps: groups matter
    with pytest.raises(ValueError, match="shuffle_seeds"):
        model(batch)
    a = model({**batch, "shuffle_seeds": shuffle_seeds(0, 3, 1)})["loss_contrastive"]
    again = model({**batch, "shuffle_seeds": shuffle_seeds(0, 3, 1)})["loss_contrastive"]
    other = model({**batch, "shuffle_seeds": shuffle_seeds(0, 4, 1)})["loss_contrastive"]
    assert a.item() == again.item() and a.item() != other.item()


def test_collated_batches_carry_one_shuffle_seed_per_key_crop():
    item = {"views": [torch.zeros(3, 4, 4, dtype=torch.uint8)], "color": None, "index": 0,
            "seed": 5, "iteration": 7, "skipped_files": []}  # fmt: skip
    batch = collate_views([item, item], run_seed=11, key_crops=2)
    assert batch["shuffle_seeds"] == shuffle_seeds(11, 7, 2)
    assert len(set(batch["shuffle_seeds"])) == 2


@pytest.mark.parametrize("channels_last", [False, True])
def test_backbone_features_equal_the_data_paths_normalisation_and_keep_the_mode(channels_last):
    """backbone_features(uint8) is the backbone in eval mode on the data path's own conversion
    and normalisation (BatchColorAugment without colour), bit for bit; a float input is taken as
    normalised; the model's training mode is restored."""
    cfg, model, batch = _tiny(**{"MODEL.CHANNELS_LAST": channels_last})
    images = batch["views"][0]
    normalised = build_batch_augment(cfg)([images], None, apply_color=False)[0]
    model.train()
    backbone = model.encoder_q.backbone
    backbone.eval()
    with torch.no_grad():
        x = (
            normalised.contiguous(memory_format=torch.channels_last)
            if channels_last
            else normalised
        )
        want = backbone(x)
    backbone.train()
    got = model.backbone_features(images)
    assert model.training and backbone.training
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(model.backbone_features(normalised), want, rtol=0, atol=0)
    assert got.shape == (8, 512)
