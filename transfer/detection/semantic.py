"""Semantic segmentation on detectron2's ``SemanticSegmentor``: Semantic FPN and DeepLabV3+
(``detectron2.projects.deeplab``), PASCAL VOC 2012 with the SBD augmented labels (VOC12-aug,
which detectron2 does not register), the training augmentations of every semantic config and
the checks of its dataset. The evaluators are in :mod:`.evaluation`, the DeepLab head of the VOC
config in :mod:`.modeling`, where a converted backbone's names go in DeepLab's ResNet in
:mod:`.layouts`.

Importing this module registers ``voc_2012_sem_seg_train_aug`` / ``voc_2012_sem_seg_val`` under
``$DETECTRON2_DATASETS/VOC2012`` (as detectron2's builtin datasets are registered when it is
imported).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, DatasetMapper, Metadata, MetadataCatalog
from detectron2.data import transforms as T
from detectron2.data.build import build_detection_train_loader

from .config import DetectionSetupError

__all__ = [
    "VOC_AUG_CLASSES",
    "build_sem_seg_train_augmentations",
    "build_sem_seg_train_loader",
    "check_cityscapes_train_ids",
    "check_sem_seg_classes",
    "load_voc_sem_seg",
    "register_voc12_aug",
]

# ---------------------------------------------------------------------------------------------
# Training data and dataset checks of every SemanticSegmentor config
# ---------------------------------------------------------------------------------------------
_IMAGE_PAD_VALUE = 128.0  # pixels padded into a small crop (0-255); labels get IGNORE_VALUE


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
