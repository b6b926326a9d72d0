"""Every shipped ImageNet pretraining config resolved at 1, 2, 4 and 8 processes, as the table of
docs/cluster.md says (the table is this resolution's output), and the refusals of what cannot
work."""

from __future__ import annotations

import functools
import re

import pytest

from pretrain.config.defaults import ConfigError, load_config
from pretrain.config.world_size import WORLD_SIZES, recipe, recipe_table, resolve_world_size
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

PRETRAIN = ROOT / "configs" / "pretrain"
SHIPPED = sorted([*PRETRAIN.glob("in1k_*.yaml"), *PRETRAIN.glob("in100_*.yaml")])
ALL = sorted(p for p in PRETRAIN.rglob("*.yaml") if not p.name.startswith("Base-"))
DOCS = (ROOT / "docs" / "cluster.md").read_text()


@functools.cache
def _cfg(path, reference: int = 0):
    opts = ["SOLVER.REFERENCE_WORLD_SIZE", str(reference), "DATASETS.ROOT", "x"]
    return load_config(str(path), opts)


def test_the_shipped_imagenet_configs_are_all_covered():
    assert len(SHIPPED) == 20 and {p.name[:4] for p in SHIPPED} == {"in1k", "in10"}


@pytest.mark.parametrize("reference", [0, 4])
def test_the_docs_table_is_the_resolution_of_every_shipped_config(reference):
    table = recipe_table([(p.name, _cfg(p, reference)) for p in SHIPPED])
    assert table in DOCS, f"docs/cluster.md lacks the table for REFERENCE_WORLD_SIZE {reference}"
    assert all(f"`{p.name}`" in table for p in SHIPPED)


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(PRETRAIN)))
def test_as_shipped_the_global_batch_and_lr_are_the_configs_at_any_world_size(path):
    cfg = _cfg(path)
    for w in WORLD_SIZES:
        r = recipe(cfg, w)
        assert (r.ims_per_batch, r.base_lr, r.final_lr) == (
            cfg.SOLVER.IMS_PER_BATCH,
            cfg.SOLVER.BASE_LR,
            cfg.SOLVER.FINAL_LR,
        )
        assert r.per_process * w == r.ims_per_batch and r.key_bn_splits == 1 and r.bn_groups == w


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_with_a_reference_world_size_the_per_gpu_batch_is_kept_and_the_lr_scales(path):
    cfg = _cfg(path, 4)  # the paper's 4 GPUs (batch 256 on IN-1K, 128 on IN-100)
    per_gpu = cfg.SOLVER.IMS_PER_BATCH // 4
    for w in WORLD_SIZES:
        r = recipe(cfg, w)
        assert r.per_process == per_gpu and r.ims_per_batch == per_gpu * w
        assert r.base_lr == pytest.approx(cfg.SOLVER.BASE_LR * w / 4)
        assert r.key_bn_splits == (2 if w == 1 else 1)  # one group would not shuffle


def test_literal_values_of_the_recipe():
    lorac = _cfg(PRETRAIN / "in1k_r50_lorac_200ep.yaml", 4)
    assert recipe(lorac, 1)[:6] == (1, 64, 64, 0.45, 0.0045, 2)
    assert recipe(lorac, 8)[:6] == (8, 512, 64, 3.6, 0.036, 1)
    resolved = resolve_world_size(lorac, 1)
    assert resolved.TEST.KNN_PERIOD == 50040 * 4 and resolved.SOLVER.CHECKPOINT_PERIOD == 20000
    assert resolved.SOLVER.REFERENCE_WORLD_SIZE == 1 and resolve_world_size(resolved, 1) is resolved
    in100 = _cfg(PRETRAIN / "in100_r18_lorac_beta2.yaml", 4)
    assert recipe(in100, 2)[:6] == (2, 64, 32, 1.0, 0.001, 1)
    assert recipe(_cfg(PRETRAIN / "in100_r18_mocov2.yaml"), 1)[:6] == (1, 128, 128, 0.1, 0.0, 1)


def test_combinations_that_cannot_work_are_one_line_errors():
    cfg = _cfg(PRETRAIN / "in100_r18_lorac_beta2.yaml", 3)  # 128 images over 3 processes
    with pytest.raises(ConfigError, match=r"IMS_PER_BATCH = 128 is not divisible by SOLVER\.REF"):
        resolve_world_size(cfg, 1)
    queue = load_config(
        str(PRETRAIN / "in100_r18_lorac_beta2.yaml"),
        ["SOLVER.REFERENCE_WORLD_SIZE", "4", "MODEL.QUEUE_SIZE", "384"],  # 3 x 128, not x 256
    )
    with pytest.raises(ConfigError, match=r"QUEUE_SIZE.*rescaled the config to 8 processes"):
        resolve_world_size(queue, 8)
    with pytest.raises(
        ConfigError, match=r"IMS_PER_BATCH = 8: must be at least 16 \(2 images x 8 proc"
    ):
        resolve_world_size(load_config(DEMO_CONFIG, ["SOLVER.IMS_PER_BATCH", "8",
                                                     "MODEL.QUEUE_SIZE", "64"]), 8)  # fmt: skip
    with pytest.raises(ConfigError, match=r"REFERENCE_WORLD_SIZE = -1: must be >= 0"):
        load_config(DEMO_CONFIG, ["SOLVER.REFERENCE_WORLD_SIZE", "-1"])


def test_the_trainer_runs_and_records_the_resolved_config(tmp_path, image_folder):
    """A config written for 2 processes, run on 1: half the batch and lr, in config.yaml too."""
    opts = tiny_opts(image_folder, tmp_path / "run", **{"SOLVER.REFERENCE_WORLD_SIZE": 2})
    cfg = load_config(DEMO_CONFIG, opts)
    trainer = PretrainTrainer(cfg)
    assert trainer.cfg.SOLVER.IMS_PER_BATCH == 4
    half = cfg.SOLVER.BASE_LR / 2
    assert abs(trainer.cfg.SOLVER.BASE_LR - half) < 1e-12 * half
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert re.search(r"IMS_PER_BATCH: 4\b", saved) and "REFERENCE_WORLD_SIZE: 1" in saved
