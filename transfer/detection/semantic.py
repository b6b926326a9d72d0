"""Semantic segmentation on detectron2's ``SemanticSegmentor``: Semantic FPN and DeepLabV3+
(``detectron2.projects.deeplab``), PASCAL VOC 2012 with the SBD augmented labels (VOC12-aug,
which detectron2 does not register), the training augmentations and evaluator of every semantic
config, and the names a converted backbone takes inside DeepLab's ResNet.

Importing this module registers ``voc_2012_sem_seg_train_aug`` / ``voc_2012_sem_seg_val`` under
``$DETECTRON2_DATASETS/VOC2012`` (as detectron2's builtin datasets are registered when it is
imported) and :class:`DeepLabV3PlusImagePoolHead` in ``SEM_SEG_HEADS_REGISTRY``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import TypeVar

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, DatasetMapper, Metadata, MetadataCatalog
from detectron2.data import transforms as T
from detectron2.data.build import build_detection_train_loader
from detectron2.evaluation import SemSegEvaluator
from detectron2.layers import ShapeSpec
from detectron2.modeling import SEM_SEG_HEADS_REGISTRY
from detectron2.projects.deeplab import DeepLabV3PlusHead

from .config import DetectionSetupError
from .convert import FPN_PREFIX

__all__ = [
    "DEEPLAB_RESNET_PREFIX",
    "SEM_SEG_EVALUATOR_TYPES",
    "VOC_AUG_CLASSES",
    "DeepLabV3PlusImagePoolHead",
    "build_sem_seg_evaluator",
    "build_sem_seg_train_augmentations",
    "build_sem_seg_train_loader",
    "check_cityscapes_train_ids",
    "check_sem_seg_classes",
    "is_deeplab_model",
    "is_semantic",
    "load_voc_sem_seg",
    "register_voc12_aug",
    "to_deeplab_names",
]

V = TypeVar("V")

# ---------------------------------------------------------------------------------------------
# Weights: the converter writes the ResNet under FPN's ``backbone.bottom_up.``; the DeepLab
# backbone (build_resnet_deeplab_backbone) *is* the ResNet, so the same tensors live under
# ``backbone.`` with the same stem/resN names (its dilation changes strides, not parameters).
# Semantic FPN uses build_resnet_fpn_backbone: the converted names fit it as they are.
# ---------------------------------------------------------------------------------------------
DEEPLAB_RESNET_PREFIX = "backbone."


def to_deeplab_names(weights: Mapping[str, V]) -> dict[str, V]:
    """The converted file's ``backbone.bottom_up.{stem,res2..res5}.*`` names as DeepLab's
    ``backbone.{stem,res2..res5}.*`` (other names, e.g. a DeepLab run's own checkpoint, are kept);
    the entry the per-layout name table uses for ``build_resnet_deeplab_backbone`` models."""
    n = len(FPN_PREFIX)
    return {
        DEEPLAB_RESNET_PREFIX + k[n:] if k.startswith(FPN_PREFIX) else k: v
        for k, v in weights.items()
    }


_RESNET_ENDS = ("stem.conv1.weight", "res5.0.conv1.weight")


def is_deeplab_model(model_keys: Collection[str]) -> bool:
    """Whether a model's state-dict keys hold a whole ResNet directly under ``backbone.`` (stem
    to res5, as ``build_resnet_deeplab_backbone`` builds it), not in an FPN
    (``backbone.bottom_up.``) nor split as in C4 models (res5 under ``roi_heads.res5``)."""
    return all(f"{DEEPLAB_RESNET_PREFIX}{k}" in model_keys for k in _RESNET_ENDS)


# ---------------------------------------------------------------------------------------------
# Training data and evaluation of every SemanticSegmentor config
# ---------------------------------------------------------------------------------------------
# evaluator_type of detectron2's builtin semantic datasets (and of VOC12-aug below)
SEM_SEG_EVALUATOR_TYPES = ("sem_seg", "cityscapes_sem_seg")
_IMAGE_PAD_VALUE = 128.0  # pixels padded into a small crop (0-255); labels get IGNORE_VALUE


def is_semantic(cfg: CfgNode) -> bool:
    """Whether ``cfg`` builds a semantic segmentation model (Semantic FPN, DeepLab)."""
    return cfg.MODEL.META_ARCHITECTURE == "SemanticSegmentor"


def build_sem_seg_train_augmentations(cfg: CfgNode) -> list[T.Augmentation]:
    """DeepLab's training augmentations (``projects/DeepLab/train_net.py``): shortest-edge
    resize to one of ``INPUT.MIN_SIZE_TRAIN``, a random ``INPUT.CROP.SIZE`` crop (retried while one
    class covers more than ``INPUT.CROP.SINGLE_CATEGORY_MAX_AREA``), a horizontal flip; plus a pad
    of images smaller than the crop up to it (labels padded with ``IGNORE_VALUE``), which
    DeepLab's fixed ASPP pooling window needs (TF DeepLab pads the same way)."""
    augs: list[T.Augmentation] = [
        T.ResizeShortestEdge(
            cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING
        )
    ]
    if cfg.INPUT.CROP.ENABLED:  # CROP.TYPE absolute: checked by load_config
        ignore = cfg.MODEL.SEM_SEG_HEAD.IGNORE_VALUE
        max_area = cfg.INPUT.CROP.get("SINGLE_CATEGORY_MAX_AREA", 1.0)
        size = tuple(cfg.INPUT.CROP.SIZE)
        augs += [
            T.RandomCrop_CategoryAreaConstraint("absolute", size, max_area, ignore),
            T.FixedSizeCrop(size, pad=True, pad_value=_IMAGE_PAD_VALUE, seg_pad_value=ignore),
        ]
    if cfg.INPUT.RANDOM_FLIP != "none":
        augs.append(T.RandomFlip(horizontal=cfg.INPUT.RANDOM_FLIP == "horizontal",
                                 vertical=cfg.INPUT.RANDOM_FLIP == "vertical"))  # fmt: skip
    return augs


def build_sem_seg_train_loader(cfg: CfgNode) -> Iterable[list[dict]]:
    """detectron2's training loader with :func:`build_sem_seg_train_augmentations`."""
    mapper = DatasetMapper(cfg, is_train=True, augmentations=build_sem_seg_train_augmentations(cfg))
    return build_detection_train_loader(cfg, mapper=mapper)


def build_sem_seg_evaluator(cfg: CfgNode, dataset_name: str, output_dir: str) -> SemSegEvaluator:
    """detectron2's ``SemSegEvaluator`` (mIoU, fwIoU, mACC, pACC and per-class IoU/ACC) for
    ``sem_seg`` and ``cityscapes_sem_seg`` datasets alike: on Cityscapes it scores the 19
    train ids of ``*_labelTrainIds.png`` at full resolution, the classes of the official
    ``cityscapesscripts`` IoU, under the same names as every other semantic protocol."""
    del cfg  # classes and ignore label come from the dataset's metadata
    return SemSegEvaluator(dataset_name, distributed=True, output_dir=output_dir)


def check_sem_seg_classes(cfg: CfgNode, name: str, meta: Metadata) -> None:
    """Raise :class:`DetectionSetupError` unless the dataset's ``stuff_classes`` and
    ``ignore_label`` fit ``MODEL.SEM_SEG_HEAD``."""
    head = cfg.MODEL.SEM_SEG_HEAD
    classes = meta.get("stuff_classes")
    if classes is None:
        raise DetectionSetupError(
            f"dataset {name} has no stuff_classes: it is not a semantic segmentation dataset "
            f"(MODEL.META_ARCHITECTURE is {cfg.MODEL.META_ARCHITECTURE})"
        )
    if len(classes) != head.NUM_CLASSES:
        raise DetectionSetupError(
            f"dataset {name} has {len(classes)} classes but MODEL.SEM_SEG_HEAD.NUM_CLASSES is "
            f"{head.NUM_CLASSES}; add MODEL.SEM_SEG_HEAD.NUM_CLASSES {len(classes)} to the options"
        )
    ignore = meta.get("ignore_label")
    if ignore is not None and ignore != head.IGNORE_VALUE:
        raise DetectionSetupError(
            f"dataset {name} ignores label {ignore} but MODEL.SEM_SEG_HEAD.IGNORE_VALUE is "
            f"{head.IGNORE_VALUE}; add MODEL.SEM_SEG_HEAD.IGNORE_VALUE {ignore} to the options"
        )


def check_cityscapes_train_ids(name: str, meta: Metadata) -> None:
    """Raise :class:`DetectionSetupError` when a Cityscapes semantic dataset has
    ``*_gtFine_labelIds.png`` but not the ``*_gtFine_labelTrainIds.png`` its loader reads (they
    are made by ``cityscapesscripts``), naming the first missing file; detectron2's loader would
    stop inside training with an assertion. Looks at the first city only."""
    gt_dir = meta.get("gt_dir")
    if (
        meta.get("evaluator_type") != "cityscapes_sem_seg"
        or not gt_dir
        or not os.path.isdir(gt_dir)
    ):
        return
    cities = sorted(d for d in os.listdir(gt_dir) if os.path.isdir(os.path.join(gt_dir, d)))
    if not cities:
        return
    city = os.path.join(gt_dir, cities[0])
    for label_file in sorted(os.listdir(city)):
        if label_file.endswith("_gtFine_labelIds.png"):
            train_ids = label_file.replace("_labelIds.png", "_labelTrainIds.png")
            if not os.path.isfile(os.path.join(city, train_ids)):
                raise DetectionSetupError(
                    f"dataset {name}: {os.path.join(city, train_ids)} does not exist; make the "
                    "train-id labels with CITYSCAPES_DATASET=<the cityscapes folder> python -m "
                    "cityscapesscripts.preparation.createTrainIdLabelImgs"
                )
            return


# ---------------------------------------------------------------------------------------------
# DeepLabV3+ whose ASPP pools the whole feature map
# ---------------------------------------------------------------------------------------------
@SEM_SEG_HEADS_REGISTRY.register()
class DeepLabV3PlusImagePoolHead(DeepLabV3PlusHead):
    """detectron2's ``DeepLabV3PlusHead`` whose ASPP image-pooling branch averages the whole
    feature map (``train_size=None``) instead of a window of the training crop's size.

    On training crops the two are the same (the window is the whole map). They differ when
    evaluating: detectron2's window needs every test image to be a multiple of the crop
    (Cityscapes' 1024x2048 images are, for 512x1024 crops), which PASCAL VOC's images of
    varying size (up to 500x500) are not; TF DeepLab pools the whole (padded) image there.
    """

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: dict[str, ShapeSpec]) -> dict:
        return {**super().from_config(cfg, input_shape), "train_size": None}


# ---------------------------------------------------------------------------------------------
# PASCAL VOC 2012 with the SBD augmented labels (VOC12-aug)
# ---------------------------------------------------------------------------------------------
VOC_AUG_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
    "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
    "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
VOC_AUG_IGNORE_LABEL = 255  # object boundaries in SegmentationClassAug
# name -> split list under VOC2012/ImageSets/Segmentation/
VOC_AUG_SPLITS = {
    "voc_2012_sem_seg_train_aug": "train_aug.txt",  # 10,582 images: VOC train + SBD
    "voc_2012_sem_seg_val": "val.txt",  # 1,449 images: VOC 2012 val
}


def load_voc_sem_seg(split_file: str, image_dir: str, label_dir: str) -> list[dict]:
    """``{file_name, sem_seg_file_name}`` of each image named in ``split_file`` (one image id
    per line, or the ``/JPEGImages/ID.jpg /SegmentationClassAug/ID.png`` pairs of some copies).

    Written here because detectron2's ``load_sem_seg`` takes every file of a folder, while VOC's
    splits are list files over one shared folder (SegmentationClassAug holds train_aug and val).
    """
    with open(split_file) as f:
        ids = [os.path.splitext(os.path.basename(line.split()[0]))[0] for line in f if line.strip()]
    if not ids:
        raise DetectionSetupError(f"{split_file} names no image")
    return [
        {
            "file_name": os.path.join(image_dir, f"{i}.jpg"),
            "sem_seg_file_name": os.path.join(label_dir, f"{i}.png"),
        }
        for i in ids
    ]


def register_voc12_aug(root: str) -> None:
    """Register VOC12-aug's two splits under ``root`` (``$DETECTRON2_DATASETS``): images in
    ``VOC2012/JPEGImages``, labels in ``VOC2012/SegmentationClassAug`` and splits in
    ``VOC2012/ImageSets/Segmentation``. Nothing is read until the dataset is used; registering
    again (another root) replaces the earlier registration."""
    voc = os.path.join(root, "VOC2012")
    image_dir, label_dir = (
        os.path.join(voc, "JPEGImages"),
        os.path.join(voc, "SegmentationClassAug"),
    )
    for name, split in VOC_AUG_SPLITS.items():
        split_file = os.path.join(voc, "ImageSets", "Segmentation", split)
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        DatasetCatalog.register(
            name, lambda s=split_file: load_voc_sem_seg(s, image_dir, label_dir)
        )
        MetadataCatalog.get(name).set(
            stuff_classes=list(VOC_AUG_CLASSES),
            image_root=image_dir,
            sem_seg_root=label_dir,
            split_file=split_file,
            evaluator_type="sem_seg",
            ignore_label=VOC_AUG_IGNORE_LABEL,
        )


register_voc12_aug(os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets")))
