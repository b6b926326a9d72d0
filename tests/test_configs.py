"""Every shipped pretraining config loads (strict keys, validation) and builds its model."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.config import load_config
from pretrain.modeling import build_model

CONFIGS = sorted(
    p
    for p in (Path(__file__).resolve().parents[1] / "configs" / "pretrain").glob("*.yaml")
    if not p.name.startswith("Base-")
)


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {
        "in1k_r50_lorac_200ep.yaml",
        "in1k_r50_mocom_200ep.yaml",
        "in1k_r50_mocov2_200ep.yaml",
        "demo_fashion_mnist_r18.yaml",
    } <= names
    assert len(names) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_builds(path):
    # shrink the queue and head so building a ResNet-50 stays cheap; the rest is as shipped
    cfg = load_config(str(path), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/nonexistent"])
    model = build_model(cfg)
    n_views = cfg.INPUT.LARGE_CROPS + cfg.INPUT.SMALL_CROPS
    assert len(model.view_sizes) == n_views
    assert model.queues.shape == (cfg.INPUT.KEY_CROPS, cfg.MODEL.QUEUE_SIZE, cfg.MODEL.HEAD_OUT_DIM)


def test_paper_values_in_the_main_configs():
    root = Path(__file__).resolve().parents[1] / "configs" / "pretrain"
    lorac = load_config(str(root / "in1k_r50_lorac_200ep.yaml"))
    assert (lorac.MODEL.ARCH, lorac.SOLVER.IMS_PER_BATCH, lorac.SOLVER.EPOCHS) == (
        "resnet50",
        256,
        200,
    )
    assert (lorac.SOLVER.BASE_LR, lorac.SOLVER.FINAL_LR, lorac.SOLVER.WEIGHT_DECAY) == (
        1.8,
        0.018,
        1e-6,
    )
    assert (lorac.LOSS.TAU, lorac.LOSS.BETA, lorac.LOSS.BETA_INF_EPOCHS) == (0.2, 4.0, 100)
    assert (lorac.INPUT.LARGE_CROPS, lorac.INPUT.SMALL_CROPS, lorac.INPUT.KEY_CROPS) == (3, 5, 2)
    assert lorac.MODEL.QUEUE_SIZE == 65536 and lorac.LOSS.PRIOR == "laplace"
    in100 = load_config(str(root / "in100_r18_lorac_beta2.yaml"))
    assert (in100.MODEL.ARCH, in100.SOLVER.IMS_PER_BATCH, in100.SOLVER.EPOCHS) == (
        "resnet18",
        128,
        100,
    )
    assert (in100.SOLVER.BASE_LR, in100.SOLVER.FINAL_LR, in100.LOSS.BETA_INF_EPOCHS) == (
        2.0,
        0.002,
        50,
    )
    assert in100.DATASETS.CLASS_LIST == "imagenet100"
