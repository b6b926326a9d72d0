"""Every shipped pretraining config loads (strict keys, validation) and builds its model."""

from __future__ import annotations

import pytest

from pretrain.config.defaults import load_config
from pretrain.data.loader import augment_views_on_device, build_batch_augment
from pretrain.modeling import build_model
from tests.helpers import ROOT

CONFIGS = sorted(
    p for p in (ROOT / "configs" / "pretrain").glob("*.yaml") if not p.name.startswith("Base-")
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
    root = ROOT / "configs" / "pretrain"
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


LORAC_CONFIGS = [
    "in1k_r50_lorac_200ep.yaml",
    "in100_r18_lorac_beta2.yaml",
    "in100_r18_lorac_beta0.5.yaml",
    "in100_r18_gaussian.yaml",
    "in100_r18_lsftmx_c3.yaml",
]


@pytest.mark.parametrize("name", LORAC_CONFIGS)
def test_shipped_lorac_models_have_five_row_q(name):
    """Q as the paper's constants imply: the three 224 queries and both keys."""
    root = ROOT / "configs" / "pretrain"
    model = build_model(
        load_config(str(root / name), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"])
    )
    assert model.criterion.q_rows == 5
    assert model.lowrank_views == [0, 1, 2] and model.key_views == [0, 1]


def test_forward_of_shipped_in100_model_hands_five_row_q_to_the_prior(monkeypatch):
    """Reads Q's shape where the prior receives it, in a forward of the shipped IN-100 model
    (only image sizes, batch, queue and head shrunk: the view layout and loss are as shipped)."""
    import torch

    import pretrain.losses.lorac as losses

    root = ROOT / "configs" / "pretrain"
    opts = [
        "MODEL.DEVICE",
        "cpu",
        "DATASETS.ROOT",
        "/x",
        "INPUT.LARGE_SIZE",
        32,
        "INPUT.SMALL_SIZE",
        16,
    ]
    opts += [
        "SOLVER.IMS_PER_BATCH",
        4,
        "MODEL.QUEUE_SIZE",
        8,
        "MODEL.HEAD_HIDDEN_DIM",
        16,
        "MODEL.HEAD_OUT_DIM",
        8,
    ]
    cfg = load_config(str(root / "in100_r18_lorac_beta2.yaml"), opts)
    model = build_model(cfg)
    model.set_beta(2.0)
    shapes = []
    real = losses.nuclear_norm
    monkeypatch.setattr(
        losses, "nuclear_norm", lambda x, *a: shapes.append(tuple(x.shape)) or real(x, *a)
    )
    views = [torch.randint(0, 255, (4, 3, s, s), dtype=torch.uint8) for s in model.view_sizes]
    batch = {"views": views, "seeds": torch.arange(4), "iteration": 0}
    batch = augment_views_on_device(batch, build_batch_augment(cfg), "cpu", apply_color=True)
    out = model(batch)
    assert torch.isfinite(out["loss_contrastive"])
    assert shapes == [(4, 5, 8)]  # (N, rows, d): one 5-row Q per instance


def test_per_key_crop_ablation_keeps_three_row_q():
    root = ROOT / "configs" / "pretrain"
    model = build_model(
        load_config(
            str(root / "in100_r18_lorac_qperkey.yaml"),
            ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"],
        )
    )
    assert model.criterion.q_construction == "per_key_crop" and model.criterion.q_rows == 3


@pytest.mark.parametrize("m", [3, 4, 5, 6, 8])
def test_m_ablation_q_has_m_rows(m):
    root = ROOT / "configs" / "pretrain"
    model = build_model(
        load_config(
            str(root / f"in100_r18_lorac_M{m}.yaml"), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"]
        )
    )
    assert model.criterion.q_rows == m


def test_mocov2_as_published():
    """Per-GPU BN, f on the query view only, and Sec. 6.2's lr 0.1 / wd 1e-4 on ImageNet-100."""
    root = ROOT / "configs" / "pretrain"
    for name in ("in100_r18_mocov2.yaml", "in1k_r50_mocov2_200ep.yaml"):
        cfg = load_config(str(root / name), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"])
        assert cfg.MODEL.NORM == "BN"
        model = build_model(cfg, world_size=2)
        assert model.query_views == [1]  # view 0 is the key crop: g only
        assert not any("SyncBatchNorm" in type(m).__name__ for m in model.encoder_q.modules())
    in100 = load_config(
        str(root / "in100_r18_mocov2.yaml"), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"]
    )
    assert (in100.SOLVER.OPTIMIZER, in100.SOLVER.BASE_LR, in100.SOLVER.WEIGHT_DECAY) == (
        "SGD",
        0.1,
        1e-4,
    )


# Training-set sizes: ImageNet-1K, and ImageNet-100 through the CMC class list.
TRAIN_IMAGES = {"in100": 126_689, "in1k": 1_281_167}


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if p.name.startswith(("in100", "in1k"))], ids=lambda p: p.stem
)
def test_imagenet_configs_run_the_knn_monitor_every_10_epochs_under_2_percent(path):
    """The kNN monitor is on, every 10 epochs, and its forward passes are < 2 % of training's
    (counting each training image as a single forward pass, a lower bound on training's cost)."""
    cfg = load_config(str(path), ["MODEL.DEVICE", "cpu"])
    images = TRAIN_IMAGES[path.name.split("_")[0]]
    every_10_epochs = 10 * (images // cfg.SOLVER.IMS_PER_BATCH)
    ten_per_class = 10 * (100 if path.name.startswith("in100") else 1000)
    t = cfg.TEST
    got = (t.KNN_PERIOD, t.KNN_TRAIN_IMAGES, t.KNN_TEST_IMAGES)
    assert got == (every_10_epochs, ten_per_class, 5000)
    assert t.KNN_ROOT
    assert (t.KNN_TRAIN_IMAGES + t.KNN_TEST_IMAGES) / (10 * images) < 0.02


def test_demo_configs_keep_the_knn_monitor_off():
    for path in CONFIGS:
        if path.name.startswith("demo"):
            assert load_config(str(path)).TEST.KNN_PERIOD == 0, path.name
