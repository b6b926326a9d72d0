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
DETECTORS = ("faster", "mask", "keypoint")
INITS = ("lorac", "supervised", "random")
ALL = [f"coco_{d}_rcnn_{i}.yaml" for d in DETECTORS for i in INITS]


def test_the_nine_configs_exist():
    assert sorted(p.name for p in CONFIGS_DIR.glob("coco_*_rcnn_*.yaml")) == sorted(ALL)


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
    raw = yaml.safe_load(BASE.read_text())
    assert tuple(raw["MODEL"]["PIXEL_MEAN"]) == IMAGENET_MEAN_255
    assert tuple(raw["MODEL"]["PIXEL_STD"]) == IMAGENET_STD_255
    for path in CONFIGS_DIR.glob("*.yaml"):
        if path != BASE:
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
