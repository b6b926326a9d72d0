"""One evaluation path for every protocol: the evaluator follows the test set's
``evaluator_type`` (set by detectron2's builtin registration, by ``--register-coco`` and by this
project's registrations), as ``build_evaluator`` does in detectron2's ``tools/train_net.py``.

=====================  ==============================  ==========================================
``evaluator_type``     detectron2 evaluator            ``results.json`` (per test set)
=====================  ==============================  ==========================================
coco                   COCOEvaluator (pycocotools)     bbox / segm / keypoints: AP, AP50, AP75 ...
lvis                   LVISEvaluator (lvis-api)        bbox / segm: AP, APr, APc, APf ...
pascal_voc             PascalVOCDetectionEvaluator     bbox: AP, AP50, AP75 (VOC07 11-point for
                                                       2007, as MoCo reports)
cityscapes_instance    CityscapesInstanceEvaluator     segm: AP, AP50 (cityscapesScripts; its
                                                       matches.json in inference/<test set>)
cityscapes_sem_seg     SemSegEvaluator (see below)     sem_seg: mIoU, fwIoU, mACC, pACC, IoU-*
sem_seg                SemSegEvaluator                 sem_seg: mIoU, fwIoU, mACC, pACC, IoU-*
=====================  ==============================  ==========================================

Cityscapes semantic segmentation is scored by ``SemSegEvaluator``, not detectron2's
``CityscapesSemSegEvaluator``: the latter runs cityscapesScripts and reports IoU, iIoU,
IoU_sup and iIoU_sup under other names, never ``mIoU``, so Cityscapes runs would not share the
semantic table's columns. ``SemSegEvaluator`` scores the 19 train ids of
``*_gtFine_labelTrainIds.png`` at full resolution, ignoring 255: the classes, pixels and IoU
definition of cityscapesScripts' class IoU (its "IoU" is that mean), without the
instance-weighted iIoU.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
from detectron2.config import CfgNode
from detectron2.data import Metadata, MetadataCatalog
from detectron2.evaluation import (
    CityscapesInstanceEvaluator,
    COCOEvaluator,
    DatasetEvaluator,
    LVISEvaluator,
    PascalVOCDetectionEvaluator,
    SemSegEvaluator,
)

from .config import DetectionSetupError

__all__ = [
    "EVALUATOR_TYPES",
    "CityscapesInstanceEvaluatorInRun",
    "build_evaluator",
    "check_evaluator_type",
]

EVALUATOR_TYPES = (
    "coco",
    "lvis",
    "pascal_voc",
    "cityscapes_instance",
    "cityscapes_sem_seg",
    "sem_seg",
)


def check_evaluator_type(dataset_name: str) -> str:
    """The ``evaluator_type`` of a registered test set; :class:`DetectionSetupError` naming it
    when no evaluator here reads it."""
    kind = MetadataCatalog.get(dataset_name).get("evaluator_type")
    if kind not in EVALUATOR_TYPES:
        raise DetectionSetupError(
            f"test set {dataset_name} has evaluator_type {kind!r}; tools/train_net.py evaluates "
            f"{', '.join(EVALUATOR_TYPES)} (register a COCO-format copy with --register-coco, or "
            "drop it from DATASETS.TEST)"
        )
    return kind


def _lvis_numpy_alias() -> None:
    """Give numpy back the ``np.float`` alias (numpy 1.24 removed it) that ``lvis`` 0.5.3, the
    latest release of the LVIS API on PyPI, still casts with in ``LVISEval.accumulate``; without
    it every LVIS evaluation fails after inference. ``np.float`` was ``float``."""
    if "float" not in np.__dict__:
        np.float = float  # type: ignore[attr-defined]


class CityscapesInstanceEvaluatorInRun(CityscapesInstanceEvaluator):
    """detectron2's ``CityscapesInstanceEvaluator`` evaluated inside the run's inference folder:
    cityscapesScripts' ``evaluateImgLists`` always writes ``matches.json`` to the current
    directory (no argument moves it), which would leave it wherever the tool was started."""

    def __init__(self, dataset_name: str, output_dir: str) -> None:
        super().__init__(dataset_name)
        self._output_dir = os.path.abspath(output_dir)
        # the ground truth is globbed from gt_dir, which $DETECTRON2_DATASETS may make relative
        meta = self._metadata.as_dict()
        self._metadata = Metadata(**{**meta, "gt_dir": os.path.abspath(meta["gt_dir"])})

    def evaluate(self) -> dict | None:
        os.makedirs(self._output_dir, exist_ok=True)
        with contextlib.chdir(self._output_dir):
            return super().evaluate()


def _instance_tasks(cfg: CfgNode) -> tuple[str, ...]:
    tasks = ["bbox"]
    if cfg.MODEL.MASK_ON:
        tasks.append("segm")
    if cfg.MODEL.KEYPOINT_ON:
        tasks.append("keypoints")
    return tuple(tasks)


def build_evaluator(cfg: CfgNode, dataset_name: str) -> DatasetEvaluator:
    """The evaluator of ``dataset_name``'s protocol (see the module's table)."""
    kind = check_evaluator_type(dataset_name)
    output_dir = f"{cfg.OUTPUT_DIR}/inference/{dataset_name}"
    if kind == "coco":
        return COCOEvaluator(
            dataset_name,
            tasks=_instance_tasks(cfg),
            distributed=True,
            output_dir=output_dir,
            max_dets_per_image=cfg.TEST.DETECTIONS_PER_IMAGE,
            use_fast_impl=False,  # the fast COCOeval is a compiled op; pycocotools is official
            kpt_oks_sigmas=cfg.TEST.KEYPOINT_OKS_SIGMAS,
        )
    if kind == "lvis":
        _lvis_numpy_alias()
        return LVISEvaluator(
            dataset_name,
            tasks=_instance_tasks(cfg),
            distributed=True,
            output_dir=output_dir,
            max_dets_per_image=cfg.TEST.DETECTIONS_PER_IMAGE,
        )
    if kind == "pascal_voc":
        return PascalVOCDetectionEvaluator(dataset_name)
    if kind == "cityscapes_instance":
        return CityscapesInstanceEvaluatorInRun(dataset_name, output_dir)
    # sem_seg and cityscapes_sem_seg alike (see the module's docstring)
    return SemSegEvaluator(dataset_name, distributed=True, output_dir=output_dir)
