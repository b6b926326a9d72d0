"""The model is encoders + queues + loss: the data path augments, the batch carries the plans.

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
    build_pretrain_loader,
    collate_views,
    shuffle_plans,
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


def _plans(iteration: int, splits: int, crops: int = 1) -> list:
    return shuffle_plans(0, iteration, crops, world=1, rank=0, b=8, splits=splits)


def test_shufflebn_takes_its_plans_from_the_batch():
    """With two key BN groups the grouping comes from batch["shuffle_plans"]: a batch without
    them is refused, another iteration's plan gives other keys (BN statistics over other
    groups), the same plan the same keys."""
    cfg, model, batch = _tiny(**{"MODEL.KEY_BN_SPLITS": 2})
    batch = augment_views_on_device(batch, build_batch_augment(cfg), "cpu", apply_color=True)
    model.eval()  # no enqueue: both forwards see the same queue
    model.encoder_k.train()  # BN in training mode, as in real steps: groups matter
    with pytest.raises(ValueError, match="shuffle_plans"):
        model(batch)
    a = model({**batch, "shuffle_plans": _plans(3, 2)})["loss_contrastive"]
    again = model({**batch, "shuffle_plans": _plans(3, 2)})["loss_contrastive"]
    other = model({**batch, "shuffle_plans": _plans(4, 2)})["loss_contrastive"]
    assert a.item() == again.item() and a.item() != other.item()


@pytest.mark.parametrize(("splits", "channels_last"), [(2, False), (3, True)])
def test_shufflebn_keys_are_the_key_encoders_keys_of_each_bn_group(splits, channels_last):
    """One process, MODEL.KEY_BN_SPLITS groups (3 groups of 8 rows: 3, 3 and 2): each key is
    the un-shuffled key encoder's on the BN group the plan puts its row in, on its row."""
    _, model, batch = _tiny(**{"MODEL.KEY_BN_SPLITS": splits,
                               "MODEL.CHANNELS_LAST": channels_last})  # fmt: skip
    views = [torch.randn(v.shape) for v in batch["views"]]
    (plan,) = _plans(3, splits)
    model.train()  # a training forward enqueues its keys: the queue (8 rows, at 0) is all of them
    model({"views": views, "shuffle_plans": [plan]})
    keys = model.queues[0]
    x = views[0].contiguous(memory_format=torch.channels_last) if channels_last else views[0]
    want = torch.empty_like(keys)
    with torch.no_grad():
        for rows in plan.global_order().tensor_split(splits):
            want[rows] = model.encoder_k(x[rows])
        plain = model.encoder_k(x)
    torch.testing.assert_close(keys, want, rtol=0, atol=1e-6)
    assert not torch.allclose(keys, plain, atol=1e-3)  # the groups matter


def _item(iteration: int = 7) -> dict:
    return {"views": [torch.zeros(3, 4, 4, dtype=torch.uint8)], "color": None, "index": 0,
            "seed": 5, "iteration": iteration, "skipped_files": []}  # fmt: skip


def test_collated_batches_carry_this_process_plan_per_key_crop():
    """The plans of (SEED, iteration, key crop) for this rank, in the batch's one block of
    (shared) memory, one per key crop; none where the loader asks for no key crop."""
    batch = collate_views([_item()] * 5, run_seed=11, key_crops=2, world=2, rank=1, splits=2,
                          shared_memory=True)  # fmt: skip
    want = shuffle_plans(11, 7, 2, world=2, rank=1, b=5, splits=2)
    block = batch["views"][0].untyped_storage().data_ptr()
    assert len(batch["shuffle_plans"]) == 2
    for got, plan in zip(batch["shuffle_plans"], want, strict=True):
        assert (got.world, got.rank, got.b, got.splits) == (2, 1, 5, 2)
        assert torch.equal(got.table, plan.table) and got.table.is_shared()
        assert got.table.untyped_storage().data_ptr() == block
    assert not torch.equal(want[0].table, want[1].table)
    assert collate_views([_item(), _item()])["shuffle_plans"] == []


@pytest.mark.parametrize(
    ("world", "extra", "plans"),
    [(2, {}, 1), (1, {"MODEL.KEY_BN_SPLITS": 2}, 1), (1, {}, 0),
     (2, {"MODEL.SHUFFLE_BN": False}, 0)],
)  # fmt: skip
def test_the_loader_draws_plans_where_shufflebn_runs(world, extra, plans):
    """ShuffleBN across more than one BN group (the model's uses_shuffle_plans): this rank's
    plans of the batch's iteration; none for one process with one group or without ShuffleBN."""
    cfg, model, _ = _tiny(**{"DATALOADER.NUM_WORKERS": 0, **extra})
    loader = build_pretrain_loader(cfg, world - 1, world, 0, source=range(64), procs_on_machine=1)
    got = loader.collate_fn([_item(iteration=3)] * 4)["shuffle_plans"]
    want = shuffle_plans(cfg.SEED, 3, plans, world=world, rank=world - 1, b=4,
                         splits=cfg.MODEL.KEY_BN_SPLITS)  # fmt: skip
    assert len(got) == len(want) == plans
    assert all(torch.equal(g.table, w.table) for g, w in zip(got, want, strict=True))


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
