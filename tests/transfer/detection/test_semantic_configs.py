"""The semantic segmentation configs load strictly (DeepLab's keys only where a config needs
them), VOC12-aug is registered in its community layout with one-line errors for missing files,
and the training pieces the trainer picks for a SemanticSegmentor (crop-and-pad augmentations,
SemSegEvaluator, the poly schedule) are the ones the configs describe. Nothing here builds a
model: test_semantic_weights.py and test_semantic_protocols.py do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.data import DatasetCatalog, Metadata, MetadataCatalog
from detectron2.data import transforms as T
from detectron2.evaluation import SemSegEvaluator
from detectron2.projects.deeplab.lr_scheduler import WarmupPolyLR

from pretrain.utils.constants import IMAGENET_MEAN_255, IMAGENET_STD_255
from pretrain.utils.errors import ConfigError
from tests.helpers import ROOT
from tests.helpers.segmentation import write_cityscapes, write_voc12_aug
from transfer.detection.config import DetectionSetupError, load_config, needs_deeplab_keys
from transfer.detection.datasets import check_datasets
from transfer.detection.semantic import (
    VOC_AUG_CLASSES,
    build_sem_seg_train_augmentations,
    check_cityscapes_train_ids,
    register_voc12_aug,
)
from transfer.detection.trainer import DetectionTrainer

CONFIGS = ROOT / "configs"
SEMANTIC = {
    "cityscapes_semantic_fpn_lorac.yaml": ("SemSegFPNHead", 19, "cityscapes_fine_sem_seg"),
    "ade20k_semantic_fpn_lorac.yaml": ("SemSegFPNHead", 150, "ade20k_sem_seg"),
    "cityscapes_deeplab_lorac.yaml": ("DeepLabV3PlusHead", 19, "cityscapes_fine_sem_seg"),
    "voc_deeplab_lorac.yaml": ("DeepLabV3PlusImagePoolHead", 21, "voc_2012_sem_seg"),
}


@pytest.mark.parametrize("name", list(SEMANTIC))
def test_semantic_config_loads_strictly_with_the_recipe(name):
    head, classes, dataset = SEMANTIC[name]
    cfg = load_config(str(CONFIGS / name))
    assert cfg.MODEL.META_ARCHITECTURE == "SemanticSegmentor"
    assert cfg.MODEL.WEIGHTS == "pretrained/lorac.pkl"
    assert (head, classes) == (cfg.MODEL.SEM_SEG_HEAD.NAME, cfg.MODEL.SEM_SEG_HEAD.NUM_CLASSES)
    assert cfg.DATASETS.TRAIN[0].startswith(dataset) and cfg.DATASETS.TEST[0].startswith(dataset)
    # the R50 of every transfer config: torchvision's RGB statistics, stride in the 3x3, SyncBN
    assert tuple(cfg.MODEL.PIXEL_MEAN) == pytest.approx(IMAGENET_MEAN_255, abs=1e-9)
    assert tuple(cfg.MODEL.PIXEL_STD) == pytest.approx(IMAGENET_STD_255, abs=1e-9)
    assert cfg.INPUT.FORMAT == "RGB" and cfg.MODEL.RESNETS.STRIDE_IN_1X1 is False
    assert cfg.MODEL.RESNETS.NORM == "SyncBN" and cfg.MODEL.BACKBONE.FREEZE_AT == 0
    assert cfg.TEST.PRECISE_BN.ENABLED is True  # tests switch it off by an override
    assert cfg.INPUT.CROP.ENABLED and cfg.INPUT.CROP.TYPE == "absolute"
    deeplab = "deeplab" in name
    assert needs_deeplab_keys(str(CONFIGS / name)) is deeplab
    assert ("STEM_TYPE" in cfg.MODEL.RESNETS) is deeplab
    if deeplab:  # detectron2's DeepLabV3+ OS16 recipe on a torchvision stem
        r = cfg.MODEL.RESNETS
        assert cfg.MODEL.BACKBONE.NAME == "build_resnet_deeplab_backbone"
        assert (r.STEM_TYPE, r.STEM_OUT_CHANNELS, r.RES5_DILATION) == ("basic", 64, 2)
        assert list(r.RES5_MULTI_GRID) == [1, 2, 4] and r.RES4_DILATION == 1
        assert cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupPolyLR" and cfg.SOLVER.POLY_LR_POWER == 0.9
        assert cfg.MODEL.SEM_SEG_HEAD.LOSS_TYPE == "hard_pixel_mining"
        assert cfg.MODEL.SEM_SEG_HEAD.NORM == "SyncBN"
    else:  # detectron2's semantic_R_50_FPN_1x
        assert cfg.MODEL.BACKBONE.NAME == "build_resnet_fpn_backbone"
        assert cfg.SOLVER.MAX_ITER == 90000 and cfg.SOLVER.BASE_LR == 0.02
        assert tuple(cfg.SOLVER.STEPS) == (60000, 80000)


def test_deeplab_keys_stay_unknown_outside_deeplab_configs():
    """Only DeepLab configs get add_deeplab_config's keys (a COCO config's dump keeps detectron2's
    keys alone, and a near-miss is still an unknown key)."""
    coco = load_config(str(CONFIGS / "coco_mask_rcnn_lorac.yaml"))
    assert "STEM_TYPE" not in coco.MODEL.RESNETS and "POLY_LR_POWER" not in coco.SOLVER
    with pytest.raises(ConfigError, match="unknown config key MODEL.RESNETS.STEM_TYP"):
        load_config(str(CONFIGS / "coco_mask_rcnn_lorac.yaml"), ["MODEL.RESNETS.STEM_TYP", "x"])
    # ...unless it asks for them: a DeepLab key on the command line is a DeepLab run
    cfg = load_config(str(CONFIGS / "ade20k_semantic_fpn_lorac.yaml"),
                      ["SOLVER.LR_SCHEDULER_NAME", "WarmupPolyLR"])  # fmt: skip
    assert cfg.SOLVER.POLY_LR_POWER == 0.9


def test_deeplab_configs_stay_strict(tmp_path):
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text(
        f'_BASE_: "{CONFIGS / "voc_deeplab_lorac.yaml"}"\n'
        "MODEL:\n  SEM_SEG_HEAD:\n    ASPP_DILATION: [6, 12, 18]\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(leaf))
    msg = str(e.value)
    assert str(leaf) in msg and "MODEL.SEM_SEG_HEAD.ASPP_DILATION" in msg
    assert "did you mean MODEL.SEM_SEG_HEAD.ASPP_DILATIONS" in msg


@pytest.fixture
def voc_root(tmp_path, monkeypatch) -> Iterator[Path]:
    """A tiny VOC12-aug under a temporary $DETECTRON2_DATASETS, registered for the test; the
    registration of the real root is restored afterwards."""
    root = tmp_path / "datasets"
    write_voc12_aug(root, {"train_aug": 3, "val": 2})
    monkeypatch.setenv("DETECTRON2_DATASETS", str(root))
    register_voc12_aug(str(root))
    yield root
    monkeypatch.undo()
    register_voc12_aug(os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets")))


def test_voc12_aug_is_read_from_its_split_lists(voc_root):
    records = DatasetCatalog.get("voc_2012_sem_seg_train_aug")
    assert len(records) == 3 and len(DatasetCatalog.get("voc_2012_sem_seg_val")) == 2
    for r in records:
        assert Path(r["file_name"]).is_file() and Path(r["sem_seg_file_name"]).is_file()
        assert Path(r["file_name"]).stem == Path(r["sem_seg_file_name"]).stem
    meta = MetadataCatalog.get("voc_2012_sem_seg_val")
    assert meta.stuff_classes == list(VOC_AUG_CLASSES) and len(VOC_AUG_CLASSES) == 21
    assert meta.ignore_label == 255 and meta.evaluator_type == "sem_seg"
    cfg = load_config(str(CONFIGS / "voc_deeplab_lorac.yaml"))
    check_datasets(cfg)
    evaluator = DetectionTrainer.build_evaluator(cfg, "voc_2012_sem_seg_val")
    assert isinstance(evaluator, SemSegEvaluator)


@pytest.mark.parametrize(
    ("remove", "what"),
    [
        ("SegmentationClassAug", "label folder"),
        ("JPEGImages", "image folder"),
        ("ImageSets/Segmentation/val.txt", "split file"),
    ],
)
def test_voc12_aug_missing_files_are_named_with_the_variable(voc_root, remove, what):
    path = voc_root / "VOC2012" / remove
    if path.is_dir():
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    else:
        path.unlink()
    cfg = load_config(str(CONFIGS / "voc_deeplab_lorac.yaml"))
    with pytest.raises(DetectionSetupError) as e:
        check_datasets(cfg, test_only=True)
    assert f"{what} {path} does not exist" in str(e.value)
    assert "$DETECTRON2_DATASETS" in str(e.value)


def test_classes_and_ignore_label_must_fit_the_head(voc_root):
    cfg = load_config(
        str(CONFIGS / "voc_deeplab_lorac.yaml"), ["MODEL.SEM_SEG_HEAD.NUM_CLASSES", "19"]
    )
    with pytest.raises(DetectionSetupError, match="has 21 classes but MODEL.SEM_SEG_HEAD.NUM_CL"):
        check_datasets(cfg)
    cfg = load_config(
        str(CONFIGS / "voc_deeplab_lorac.yaml"), ["MODEL.SEM_SEG_HEAD.IGNORE_VALUE", "0"]
    )
    with pytest.raises(
        DetectionSetupError, match="ignores label 255 but MODEL.SEM_SEG_HEAD.IGNORE"
    ):
        check_datasets(cfg)


def test_training_crops_are_padded_to_the_crop_with_ignored_labels():
    """An image smaller than the crop (VOC at a small scale) comes out crop-sized, its padding
    labelled IGNORE_VALUE, so DeepLab's ASPP pooling window always fits; a larger one is
    cropped."""
    cfg = load_config(
        str(CONFIGS / "voc_deeplab_lorac.yaml"),
        ["INPUT.MIN_SIZE_TRAIN", "(20, 20)", "INPUT.CROP.SIZE", "(32, 48)",
         "INPUT.RANDOM_FLIP", "none"],
    )  # fmt: skip
    augs = T.AugmentationList(build_sem_seg_train_augmentations(cfg))
    image = np.full((20, 30, 3), 7, dtype=np.uint8)
    small = T.AugInput(image, sem_seg=np.ones((20, 30), dtype=np.uint8))
    augs(small)
    assert small.image.shape == (32, 48, 3) and small.sem_seg.shape == (32, 48)
    assert (small.sem_seg[:20, :30] == 1).all() and (small.sem_seg[20:] == 255).all()
    cfg.INPUT.MIN_SIZE_TRAIN = (100, 100)
    big = T.AugInput(image, sem_seg=np.ones((20, 30), dtype=np.uint8))
    T.AugmentationList(build_sem_seg_train_augmentations(cfg))(big)
    assert big.image.shape == (32, 48, 3) and (big.sem_seg == 1).all()


def test_deeplab_configs_train_with_the_poly_schedule():
    cfg = load_config(str(CONFIGS / "cityscapes_deeplab_lorac.yaml"))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.SOLVER.BASE_LR)
    assert isinstance(DetectionTrainer.build_lr_scheduler(cfg, optimizer), WarmupPolyLR)


def test_cityscapes_without_train_id_labels_is_named(tmp_path):
    """Cityscapes as downloaded has no *_labelTrainIds.png: one error naming the file and the
    cityscapesscripts command that makes them (detectron2's loader would assert mid-run)."""
    write_cityscapes(tmp_path, {"val": 2})
    gt_dir = tmp_path / "cityscapes" / "gtFine" / "val"
    meta = Metadata(evaluator_type="cityscapes_sem_seg", gt_dir=str(gt_dir))
    check_cityscapes_train_ids("cityscapes_fine_sem_seg_val", meta)
    missing = gt_dir / "aachen" / "aachen_000000_000019_gtFine_labelTrainIds.png"
    missing.unlink()
    with pytest.raises(DetectionSetupError) as e:
        check_cityscapes_train_ids("cityscapes_fine_sem_seg_val", meta)
    assert str(missing) in str(e.value) and "createTrainIdLabelImgs" in str(e.value)


def test_semantic_crops_must_have_a_fixed_size():
    with pytest.raises(ConfigError, match="INPUT.CROP.TYPE 'relative_range': semantic segm"):
        load_config(str(CONFIGS / "ade20k_semantic_fpn_lorac.yaml"),
                    ["INPUT.CROP.TYPE", "relative_range"])  # fmt: skip
