"""Tiny semantic segmentation datasets in their real on-disk layouts, under a
``$DETECTRON2_DATASETS`` root: Cityscapes fine (as detectron2's builtin loader and
``cityscapesscripts`` lay it out), ADE20K SceneParsing with detectron2's ``annotations_detectron2``,
and PASCAL VOC 2012 with the SBD augmented labels (VOC12-aug). Images are smooth noise with a few
label regions drawn into both the image and its label map."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["cityscapes_train_ids", "write_ade20k", "write_cityscapes", "write_voc12_aug"]


def _scene(rng: np.random.Generator, h: int, w: int, labels: list[int], void: int) -> tuple:
    """An RGB image and a label map of vertical bands of ``labels`` with a ``void`` border."""
    label = np.full((h, w), labels[0], dtype=np.uint8)
    bounds = np.linspace(0, w, len(labels) + 1).astype(int)
    image = rng.integers(0, 60, size=(h, w, 3)).astype(np.uint8)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        label[:, a:b] = labels[k]
        image[:, a:b] += np.array([40 * k % 190, 120, 30 * k % 190], dtype=np.uint8)
    label[:2, :] = void
    return image, label


def cityscapes_train_ids(label_ids: np.ndarray) -> np.ndarray:
    """A ``*_gtFine_labelIds.png`` array as the ``*_gtFine_labelTrainIds.png`` that
    ``cityscapesscripts/preparation/createTrainIdLabelImgs.py`` makes of it (255: ignored)."""
    from cityscapesscripts.helpers.labels import id2label

    lut = np.full(256, 255, dtype=np.uint8)
    for i, lab in id2label.items():
        if 0 <= i < 256 and lab.trainId not in (-1, 255):
            lut[i] = lab.trainId
    return lut[label_ids]


def write_cityscapes(root: Path, sizes: dict[str, int], h: int = 64, w: int = 128) -> None:
    """``cityscapes/leftImg8bit/SPLIT/CITY/*_leftImg8bit.png`` and ``gtFine/SPLIT/CITY/`` with
    ``*_gtFine_{labelIds,instanceIds,labelTrainIds}.png`` and ``*_gtFine_polygons.json``
    (train ids as ``cityscapesscripts/preparation/createTrainIdLabelImgs.py`` writes them)."""
    rng = np.random.default_rng(0)
    ids = [7, 11, 21, 23, 26, 24]  # road, building, vegetation, sky, car, person
    for split, n in sizes.items():
        for k in range(n):
            city = "aachen" if k % 2 == 0 else "bremen"
            stem = f"{city}_{k:06d}_000019"
            image_dir = root / "cityscapes" / "leftImg8bit" / split / city
            gt_dir = root / "cityscapes" / "gtFine" / split / city
            image_dir.mkdir(parents=True, exist_ok=True)
            gt_dir.mkdir(parents=True, exist_ok=True)
            image, label_ids = _scene(rng, h, w, list(np.roll(ids, k)[:4]), void=0)
            Image.fromarray(image).save(image_dir / f"{stem}_leftImg8bit.png")
            Image.fromarray(label_ids).save(gt_dir / f"{stem}_gtFine_labelIds.png")
            Image.fromarray(label_ids).save(gt_dir / f"{stem}_gtFine_instanceIds.png")
            Image.fromarray(cityscapes_train_ids(label_ids)).save(
                gt_dir / f"{stem}_gtFine_labelTrainIds.png"
            )
            (gt_dir / f"{stem}_gtFine_polygons.json").write_text(
                json.dumps({"imgHeight": h, "imgWidth": w, "objects": []})
            )


def write_ade20k(root: Path, sizes: dict[str, int], h: int = 48, w: int = 64) -> None:
    """``ADEChallengeData2016/images/{training,validation}/*.jpg`` and
    ``annotations_detectron2/{training,validation}/*.png`` (labels 0-149, 255 for "other", as
    detectron2's ``prepare_ade20k_sem_seg.py`` writes them)."""
    rng = np.random.default_rng(1)
    base = root / "ADEChallengeData2016"
    for split, n in sizes.items():
        prefix = "ADE_train" if split == "training" else "ADE_val"
        (base / "images" / split).mkdir(parents=True, exist_ok=True)
        (base / "annotations_detectron2" / split).mkdir(parents=True, exist_ok=True)
        for k in range(n):
            stem = f"{prefix}_{k + 1:08d}"
            image, label = _scene(rng, h, w, [0, 2, 12 + k, 149], void=255)
            Image.fromarray(image).save(base / "images" / split / f"{stem}.jpg", quality=95)
            Image.fromarray(label).save(base / "annotations_detectron2" / split / f"{stem}.png")


def write_voc12_aug(root: Path, sizes: dict[str, int], h: int = 50, w: int = 67) -> None:
    """``VOC2012/JPEGImages/*.jpg``, ``SegmentationClassAug/*.png`` (labels 0-20, 255 on
    boundaries) and ``ImageSets/Segmentation/{train_aug,val}.txt`` (one id per line); images of
    VOC-like odd sizes, not multiples of the output stride."""
    rng = np.random.default_rng(2)
    voc = root / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClassAug", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        ids = [f"2007_{split[:3]}{k:03d}" for k in range(n)]
        for k, i in enumerate(ids):
            image, label = _scene(rng, h + k, w - k, [0, 15, 1 + k % 20], void=255)
            Image.fromarray(image).save(voc / "JPEGImages" / f"{i}.jpg", quality=95)
            Image.fromarray(label).save(voc / "SegmentationClassAug" / f"{i}.png")
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
