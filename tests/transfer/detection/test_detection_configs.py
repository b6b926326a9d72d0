"""Every shipped detection config loads strictly and builds; the shared settings are the ones the
docs promise; config errors name the key and the file; SyncBN is adapted on multi-process CPU."""

from __future__ import annotations

import pytest
import torch
import yaml
from detectron2.modeling import build_model

import transfer.detection  # noqa: F401 - importing the project must be all configs need
from pretrain.utils.constants import IMAGENET_MEAN_255, IMAGENET_STD_255
from pretrain.utils.errors import ConfigError
from tests.helpers import ROOT
from transfer.detection.config import load_config, use_naive_syncbn_on_cpu

CONFIGS_DIR = ROOT / "configs"
BASE = CONFIGS_DIR / "Base-RCNN-FPN-SyncBN.yaml"
R50_BASE = CONFIGS_DIR / "Base-R50-torchvision-SyncBN.yaml"  # holds the pixel statistics
DETECTORS = ("faster", "mask", "keypoint")
INITS = ("lorac", "supervised", "random")
ALL = [f"coco_{d}_rcnn_{i}.yaml" for d in DETECTORS for i in INITS]
# protocol family -> (train sets, test sets, classes, max iter, images per batch, backbone)
FAMILIES = {
    "voc_faster_rcnn_c4": (
        ("voc_2007_trainval", "voc_2012_trainval"), ("voc_2007_test",), 20, 24000, 16, "c4"
    ),
    "coco_mask_rcnn_c4": (("coco_2017_train",), ("coco_2017_val",), 80, 90000, 16, "c4"),
    "coco_mask_rcnn_c4_2x": (("coco_2017_train",), ("coco_2017_val",), 80, 180000, 16, "c4"),
    "coco_faster_rcnn_2x": (("coco_2017_train",), ("coco_2017_val",), 80, 180000, 16, "fpn"),
    "coco_mask_rcnn_2x": (("coco_2017_train",), ("coco_2017_val",), 80, 180000, 16, "fpn"),
    "coco_keypoint_rcnn_2x": (
        ("keypoints_coco_2017_train",), ("keypoints_coco_2017_val",), 1, 180000, 16, "fpn"
    ),
    "lvis_mask_rcnn": (("lvis_v1_train",), ("lvis_v1_val",), 1203, 90000, 16, "fpn"),
    "cityscapes_mask_rcnn": (
        ("cityscapes_fine_instance_seg_train",), ("cityscapes_fine_instance_seg_val",), 8,
        24000, 8, "fpn",
    ),
}  # fmt: skip
PROTOCOL_CONFIGS = [f"{f}_{i}.yaml" for f in FAMILIES for i in INITS]
WEIGHTS = {"lorac": "pretrained/lorac.pkl", "supervised": "pretrained/supervised.pkl", "random": ""}


def test_every_detection_protocol_ships_lorac_supervised_and_random():
    shipped = {p.name for p in CONFIGS_DIR.glob("*_rcnn_*.yaml")}
    assert shipped == set(ALL) | set(PROTOCOL_CONFIGS)


@pytest.mark.parametrize("name", PROTOCOL_CONFIGS)
def test_protocol_config_loads_strictly_with_its_recipe(name):
    """Each protocol's config: its datasets, classes and schedule, the shared torchvision R50
    (RGB statistics, stride in the 3x3, SyncBN, FREEZE_AT 0, precise-BN) and its init."""
    family, init = name.removesuffix(".yaml").rsplit("_", 1)
    train, test, classes, max_iter, batch, backbone = FAMILIES[family]
    cfg = load_config(str(CONFIGS_DIR / name))
    assert (train, test) == (cfg.DATASETS.TRAIN, cfg.DATASETS.TEST)
    assert classes == cfg.MODEL.ROI_HEADS.NUM_CLASSES
    assert (max_iter, batch) == (cfg.SOLVER.MAX_ITER, cfg.SOLVER.IMS_PER_BATCH)
    assert WEIGHTS[init] == cfg.MODEL.WEIGHTS
    assert tuple(cfg.MODEL.PIXEL_MEAN) == IMAGENET_MEAN_255 and cfg.INPUT.FORMAT == "RGB"
    assert cfg.MODEL.RESNETS.STRIDE_IN_1X1 is False and cfg.MODEL.BACKBONE.FREEZE_AT == 0
    assert cfg.MODEL.RESNETS.NORM == "SyncBN" and cfg.TEST.PRECISE_BN.ENABLED
    if backbone == "c4":
        assert cfg.MODEL.ROI_HEADS.NAME == "Res5ROIHeadsExtraNorm"
        assert cfg.MODEL.BACKBONE.NAME == "build_resnet_backbone"
    else:
        assert cfg.MODEL.BACKBONE.NAME == "build_resnet_fpn_backbone"
        assert cfg.MODEL.FPN.NORM == "SyncBN"


def test_voc_c4_is_mocos_recipe():
    """MoCo's pascal_voc_R_50_C4_24k_moco.yaml: steps 18k/22k, LR 0.02, 100 warm-up
    iterations, multi-scale 480-800."""
    cfg = load_config(str(CONFIGS_DIR / "voc_faster_rcnn_c4_lorac.yaml"))
    assert tuple(cfg.SOLVER.STEPS) == (18000, 22000) and cfg.SOLVER.BASE_LR == 0.02
    assert cfg.SOLVER.WARMUP_ITERS == 100
    assert tuple(cfg.INPUT.MIN_SIZE_TRAIN) == tuple(range(480, 801, 32))


def test_lvis_samples_by_repeat_factor_and_keeps_300_detections():
    cfg = load_config(str(CONFIGS_DIR / "lvis_mask_rcnn_lorac.yaml"))
    assert cfg.DATALOADER.SAMPLER_TRAIN == "RepeatFactorTrainingSampler"
    assert cfg.TEST.DETECTIONS_PER_IMAGE == 300


def test_c4_model_has_syncbn_everywhere_and_the_extra_norm_after_res5():
    cfg = load_config(str(CONFIGS_DIR / "coco_mask_rcnn_c4_lorac.yaml"), ["MODEL.DEVICE", "cpu"])
    model = build_model(cfg)
    assert isinstance(model.roi_heads.res5.norm, torch.nn.SyncBatchNorm)
    assert model.roi_heads.res5.norm.num_features == 2048
    assert isinstance(model.backbone.stem.conv1.norm, torch.nn.SyncBatchNorm)
    assert isinstance(model.roi_heads.res5[0].conv1.norm, torch.nn.SyncBatchNorm)
    assert all(p.requires_grad for p in model.parameters())  # FREEZE_AT 0


@pytest.mark.parametrize("name", ALL)
def test_config_loads_and_builds(name):
    cfg = load_config(str(CONFIGS_DIR / name), ["MODEL.DEVICE", "cpu"])
    detector, init = name.split("_")[1], name.split("_")[3].removesuffix(".yaml")
    expected_weights = {"lorac": "pretrained/lorac.pkl", "supervised": "pretrained/supervised.pkl"}
    weights = cfg.MODEL.WEIGHTS
    assert weights == expected_weights.get(init, "")
    assert cfg.MODEL.MASK_ON is (detector == "mask")
    assert cfg.MODEL.KEYPOINT_ON is (detector == "keypoint")
    if detector == "keypoint":
        assert cfg.DATASETS.TRAIN == ("keypoints_coco_2017_train",)
        assert cfg.DATASETS.TEST == ("keypoints_coco_2017_val",)
        assert cfg.MODEL.ROI_HEADS.NUM_CLASSES == 1
    else:
        assert cfg.DATASETS.TRAIN == ("coco_2017_train",)
        assert cfg.DATASETS.TEST == ("coco_2017_val",)
        assert cfg.MODEL.ROI_HEADS.NUM_CLASSES == 80
    model = build_model(cfg)
    assert isinstance(model.backbone.bottom_up.stem.conv1.norm, torch.nn.SyncBatchNorm)
    assert isinstance(model.backbone.fpn_lateral2.norm, torch.nn.SyncBatchNorm)
    assert all(p.requires_grad for p in model.backbone.parameters())  # FREEZE_AT 0


@pytest.mark.parametrize("name", ALL)
def test_shared_settings(name):
    """torchvision RGB normalisation, R50 with stride in the 3x3, SyncBN, 1x COCO schedule."""
    cfg = load_config(str(CONFIGS_DIR / name))
    assert tuple(cfg.MODEL.PIXEL_MEAN) == pytest.approx(IMAGENET_MEAN_255, abs=1e-9)
    assert tuple(cfg.MODEL.PIXEL_STD) == pytest.approx(IMAGENET_STD_255, abs=1e-9)
    assert cfg.INPUT.FORMAT == "RGB"
    assert cfg.MODEL.RESNETS.DEPTH == 50 and cfg.MODEL.RESNETS.STRIDE_IN_1X1 is False
    assert cfg.MODEL.BACKBONE.NAME == "build_resnet_fpn_backbone"
    assert cfg.MODEL.BACKBONE.FREEZE_AT == 0
    assert cfg.MODEL.RESNETS.NORM == cfg.MODEL.FPN.NORM == "SyncBN"
    assert cfg.SOLVER.MAX_ITER == 90000 and cfg.SOLVER.IMS_PER_BATCH == 16
    assert tuple(cfg.SOLVER.STEPS) == (60000, 80000) and cfg.SOLVER.BASE_LR == 0.02


def test_pixel_statistics_are_written_once_in_the_base():
    """YAML cannot import the constants: the one place holding them must equal them."""
    raw = yaml.safe_load(R50_BASE.read_text())
    assert tuple(raw["MODEL"]["PIXEL_MEAN"]) == IMAGENET_MEAN_255
    assert tuple(raw["MODEL"]["PIXEL_STD"]) == IMAGENET_STD_255
    for path in CONFIGS_DIR.glob("*.yaml"):
        if path != R50_BASE:
            assert "PIXEL_" not in path.read_text(), path


def test_unknown_key_in_a_leaf_names_key_and_file(tmp_path):
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text(f'_BASE_: "{BASE}"\nSOLVER:\n  BASE_LRR: 0.1\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(leaf))
    assert str(leaf) in str(e.value) and "SOLVER.BASE_LRR" in str(e.value)


def test_unknown_key_in_a_base_names_the_base(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(f'_BASE_: "{BASE}"\nMODEL:\n  FPN:\n    NROM: "GN"\n')
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text('_BASE_: "base.yaml"\nMODEL:\n  MASK_ON: True\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(leaf))
    assert str(e.value).startswith(f"{base}:") and "MODEL.FPN.NROM" in str(e.value)


def test_type_mismatch_and_command_line_errors(tmp_path):
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text(f'_BASE_: "{BASE}"\nSOLVER:\n  MAX_ITER: "long"\n')
    with pytest.raises(ConfigError, match=r"leaf\.yaml: .*SOLVER\.MAX_ITER"):
        load_config(str(leaf))
    with pytest.raises(ConfigError, match=r"command-line .*MODEL\.RESNETS\.DEPT\b"):
        load_config(str(BASE), ["MODEL.RESNETS.DEPT", "18"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(str(tmp_path / "absent.yaml"))


def test_syncbn_becomes_naive_only_for_multi_process_cpu():
    cfg = load_config(str(CONFIGS_DIR / "coco_mask_rcnn_lorac.yaml"), ["MODEL.DEVICE", "cpu"])
    assert use_naive_syncbn_on_cpu(cfg.clone(), world_size=1) == []
    gpu = cfg.clone()
    gpu.MODEL.DEVICE = "cuda"
    assert use_naive_syncbn_on_cpu(gpu, world_size=2) == []
    changed = use_naive_syncbn_on_cpu(cfg, world_size=2)
    assert changed == ["MODEL.FPN.NORM", "MODEL.RESNETS.NORM"]
    assert cfg.MODEL.RESNETS.NORM == cfg.MODEL.FPN.NORM == "naiveSyncBN"
