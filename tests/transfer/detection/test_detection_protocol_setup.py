"""What every protocol shares before training, without training: the weights renamed to each
model's layout, the datasets found under ``$DETECTRON2_DATASETS`` (a missing folder or file is one
line naming it and the variable), a test set's evaluator picked by its ``evaluator_type``, and
``SOLVER.AMP.ENABLED`` on a CPU."""

from __future__ import annotations

import shutil

import pytest
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import (
    COCOEvaluator,
    LVISEvaluator,
    PascalVOCDetectionEvaluator,
    SemSegEvaluator,
)

from tests.helpers import ROOT
from tests.transfer.detection.real_layouts import (
    builtin_datasets_under,
    write_cityscapes,
    write_coco,
    write_lvis,
    write_voc,
)
from transfer.detection import datasets
from transfer.detection.config import DetectionSetupError, ignore_amp_on_cpu, load_config
from transfer.detection.evaluation import CityscapesInstanceEvaluatorInRun, build_evaluator
from transfer.detection.layouts import model_layout, rename_for_model

CONFIGS = ROOT / "configs"
FPN_KEYS = [f"backbone.bottom_up.{s}.0.conv1.weight" for s in ("res2", "res3", "res4", "res5")]
FPN_KEYS += ["backbone.bottom_up.stem.conv1.weight", "backbone.fpn_lateral2.weight"]
C4_KEYS = [f"backbone.{s}.0.conv1.weight" for s in ("res2", "res3", "res4")]
C4_KEYS += [
    "backbone.stem.conv1.weight",
    "roi_heads.res5.0.conv1.weight",
    "roi_heads.res5.norm.weight",
]  # noqa: E501


def test_a_converted_backbone_is_renamed_to_each_models_layout():
    """FPN-prefixed, C4-placed and bare names all land where the model keeps each stage; a file
    that also holds other weights (a trained model) is left as it is."""
    fpn_file = {
        "backbone.bottom_up.stem.conv1.weight": 1,
        "backbone.bottom_up.res5.0.conv1.weight": 2,
    }
    assert (model_layout(FPN_KEYS), model_layout(C4_KEYS)) == ("fpn", "c4")
    assert rename_for_model(fpn_file, C4_KEYS) == {
        "backbone.stem.conv1.weight": 1,
        "roi_heads.res5.0.conv1.weight": 2,
    }
    c4_file = rename_for_model(fpn_file, C4_KEYS)
    assert rename_for_model(c4_file, FPN_KEYS) == fpn_file
    assert rename_for_model({"stem.conv1.weight": 1, "res5.0.conv1.weight": 2}, C4_KEYS) == c4_file
    trained = {**fpn_file, "roi_heads.box_predictor.cls_score.weight": 3}
    assert rename_for_model(trained, C4_KEYS) == trained
    assert rename_for_model(fpn_file, ["head.weight"]) == fpn_file  # no known layout


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("detectron2_datasets")
    for write in (write_voc, write_coco, write_lvis, write_cityscapes):
        write(root)
    return root


@pytest.mark.parametrize(
    ("config", "removed", "named"),
    [
        ("voc_faster_rcnn_c4_lorac.yaml", "VOC2012/ImageSets/Main/trainval.txt", "split list"),
        ("coco_mask_rcnn_c4_lorac.yaml", "coco/annotations/instances_train2017.json", "annotation"),
        ("lvis_mask_rcnn_lorac.yaml", "lvis/lvis_v1_val.json", "annotation file"),
        ("cityscapes_mask_rcnn_lorac.yaml", "cityscapes/gtFine/val", "annotation folder"),
    ],
)
def test_a_missing_dataset_file_names_it_and_the_variable(
    config, removed, named, root, tmp_path, monkeypatch
):
    """Each protocol's data is found where detectron2's builtin registration looks; with one
    file or folder gone the check names it and $DETECTRON2_DATASETS."""
    monkeypatch.setattr(datasets, "has_shapely", lambda: True)
    copy = tmp_path / "datasets"
    shutil.copytree(root, copy)
    with builtin_datasets_under(copy):
        cfg = load_config(str(CONFIGS / config))
        datasets.check_datasets(cfg)  # all there
        gone = copy / removed
        shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
        with pytest.raises(DetectionSetupError) as e:
            datasets.check_datasets(cfg)
    msg = str(e.value)
    assert named in msg and str(gone) in msg
    assert f"$DETECTRON2_DATASETS, now '{copy}'" in msg


def test_cityscapes_instances_without_shapely_are_one_error_line(root, monkeypatch):
    monkeypatch.setattr(datasets, "has_shapely", lambda: False)
    with builtin_datasets_under(root):
        cfg = load_config(str(CONFIGS / "cityscapes_mask_rcnn_lorac.yaml"))
        with pytest.raises(DetectionSetupError, match="with shapely, which is not installed: pip"):
            datasets.check_datasets(cfg)


@pytest.mark.parametrize(
    ("dataset", "evaluator"),
    [
        ("coco_2017_val", COCOEvaluator),
        ("lvis_v1_val", LVISEvaluator),
        ("voc_2007_test", PascalVOCDetectionEvaluator),
        ("cityscapes_fine_instance_seg_val", CityscapesInstanceEvaluatorInRun),
        # mIoU over the 19 train ids, the columns of every semantic protocol (evaluation.py)
        ("cityscapes_fine_sem_seg_val", SemSegEvaluator),
        ("a_sem_seg_set", SemSegEvaluator),  # as ADE20K's (whose files SemSegEvaluator lists)
    ],
)
def test_the_evaluator_follows_the_test_sets_evaluator_type(dataset, evaluator, root, tmp_path):
    cfg = load_config(str(CONFIGS / "coco_mask_rcnn_lorac.yaml"), ["OUTPUT_DIR", str(tmp_path)])
    with builtin_datasets_under(root):
        DatasetCatalog.register("a_sem_seg_set", list)
        MetadataCatalog.get("a_sem_seg_set").set(
            evaluator_type="sem_seg", stuff_classes=["a", "b"], ignore_label=255
        )
        assert type(build_evaluator(cfg, dataset)) is evaluator


def test_a_test_set_without_an_evaluator_is_refused_before_training(root):
    DatasetCatalog.register("no_evaluator", list)
    MetadataCatalog.get("no_evaluator").set(thing_classes=["a"] * 80)
    try:
        cfg = load_config(str(CONFIGS / "coco_mask_rcnn_lorac.yaml"))
        cfg.DATASETS.TRAIN = cfg.DATASETS.TEST = ("no_evaluator",)
        with pytest.raises(DetectionSetupError, match="no_evaluator has evaluator_type None"):
            datasets.check_datasets(cfg)
    finally:
        DatasetCatalog.remove("no_evaluator")
        MetadataCatalog.remove("no_evaluator")


def test_amp_is_ignored_on_a_cpu_with_one_note():
    cfg = load_config(
        str(CONFIGS / "voc_faster_rcnn_c4_lorac.yaml"), ["SOLVER.AMP.ENABLED", "True"]
    )
    assert ignore_amp_on_cpu(cfg) is None and cfg.SOLVER.AMP.ENABLED  # a GPU config keeps it
    cfg.MODEL.DEVICE = "cpu"
    note = ignore_amp_on_cpu(cfg)
    assert (
        note.startswith("SOLVER.AMP.ENABLED True -> False on the CPU")
        and not cfg.SOLVER.AMP.ENABLED
    )
