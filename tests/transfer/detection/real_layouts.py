"""Tiny datasets written in each protocol's real on-disk layout under a ``$DETECTRON2_DATASETS``
root, and detectron2's own builtin registration run again over that root (what importing
detectron2 does with the variable set), so that its loaders and evaluators read them.

Images are a few squares and triangles on a plain background; every object's class, box, polygon
and mask agree, in each format's own conventions (VOC's 1-based inclusive boxes, COCO's
``[x, y, w, h]`` and polygons, LVIS's ``coco_url`` and frequency fields, Cityscapes' ``id*1000 +
k`` instance ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import builtin
from detectron2.data.datasets.builtin_meta import COCO_CATEGORIES, COCO_PERSON_KEYPOINT_NAMES
from detectron2.data.datasets.lvis_v1_categories import LVIS_CATEGORIES
from detectron2.data.datasets.pascal_voc import CLASS_NAMES as VOC_CLASSES
from PIL import Image, ImageDraw

from tests.helpers.segmentation import cityscapes_train_ids

W, H = 96, 64  # every image; the tests resize to a shorter side of 64


@contextmanager
def builtin_datasets_under(root: Path) -> Iterator[None]:
    """detectron2's builtin datasets registered under ``root`` as ``$DETECTRON2_DATASETS``, by
    the same calls ``detectron2.data.datasets.builtin`` makes on import; the catalogs (and the
    variable) are restored afterwards."""
    saved = dict(DatasetCatalog), dict(MetadataCatalog)
    old_env = os.environ.get("DETECTRON2_DATASETS")
    os.environ["DETECTRON2_DATASETS"] = str(root)
    DatasetCatalog.clear()
    MetadataCatalog.clear()
    try:
        _root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
        builtin.register_all_coco(_root)
        builtin.register_all_lvis(_root)
        builtin.register_all_cityscapes(_root)
        builtin.register_all_cityscapes_panoptic(_root)
        builtin.register_all_pascal_voc(_root)
        builtin.register_all_ade20k(_root)
        yield
    finally:
        DatasetCatalog.clear()
        MetadataCatalog.clear()
        DatasetCatalog.update(saved[0])
        MetadataCatalog.update(saved[1])
        if old_env is None:
            os.environ.pop("DETECTRON2_DATASETS", None)
        else:
            os.environ["DETECTRON2_DATASETS"] = old_env


def _objects(rng: np.random.Generator, classes: list[int]) -> list[tuple[int, list]]:
    """``(class, polygon)`` per class: squares for even classes, triangles for odd ones, each
    at least 20 pixels on a side, inside the image."""
    out = []
    for c in classes:
        w, h = (int(s) for s in rng.integers(20, 32, 2))
        x0, y0 = int(rng.integers(0, W - w)), int(rng.integers(0, H - h))
        x1, y1 = x0 + w, y0 + h
        if c % 2 == 0:
            polygon = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        else:
            polygon = [(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)]
        out.append((c, polygon))
    return out


def _draw(objects: list[tuple[int, list]], rng: np.random.Generator) -> Image.Image:
    img = Image.new("RGB", (W, H), tuple(int(v) for v in rng.integers(0, 80, 3)))
    draw = ImageDraw.Draw(img)
    for c, polygon in objects:
        draw.polygon(polygon, fill=(200, (40 * c) % 256, 40))
    return img


def _box(polygon: list) -> tuple[int, int, int, int]:
    xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
    return min(xs), min(ys), max(xs), max(ys)


# ---------------------------------------------------------------------------------------------
# Pascal VOC: VOC{year}/Annotations/*.xml, ImageSets/Main/{split}.txt, JPEGImages/*.jpg


def write_voc(root: Path) -> None:
    """VOC2007 trainval (2 images) and test (4 images: every one of the 20 classes once, so
    that each class's AP is defined) and VOC2012 trainval (2 images)."""
    rng = np.random.default_rng(7)
    splits = {
        ("VOC2007", "trainval"): [[0, 1, 2], [3, 4, 5]],
        ("VOC2007", "test"): [list(range(i, 20, 4)) for i in range(4)],
        ("VOC2012", "trainval"): [[6, 7, 8], [9, 10, 11]],
    }
    for (year, split), images in splits.items():
        d = root / year
        for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        ids = []
        for k, classes in enumerate(images):
            file_id = f"{year[3:]}_{split}_{k:06d}"
            objects = _objects(rng, classes)
            _draw(objects, rng).save(d / "JPEGImages" / f"{file_id}.jpg", quality=95)
            (d / "Annotations" / f"{file_id}.xml").write_text(_voc_xml(file_id, year, objects))
            ids.append(file_id)
        (d / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")


def _voc_xml(file_id: str, year: str, objects: list[tuple[int, list]]) -> str:
    parts = [
        f"<annotation><folder>{year}</folder><filename>{file_id}.jpg</filename>",
        f"<size><width>{W}</width><height>{H}</height><depth>3</depth></size>",
        "<segmented>0</segmented>",
    ]
    for c, polygon in objects:
        x0, y0, x1, y1 = _box(polygon)
        parts.append(
            f"<object><name>{VOC_CLASSES[c]}</name><pose>Unspecified</pose>"
            "<truncated>0</truncated><difficult>0</difficult><bndbox>"
            f"<xmin>{x0 + 1}</xmin><ymin>{y0 + 1}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax>"
            "</bndbox></object>"
        )
    return "".join(parts) + "</annotation>\n"


# ---------------------------------------------------------------------------------------------
# COCO 2017: coco/annotations/{instances,person_keypoints}_{train,val}2017.json, coco/{split}2017/


def _coco_annotation(ann_id: int, image_id: int, category_id: int, polygon: list) -> dict:
    x0, y0, x1, y1 = _box(polygon)
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [x0, y0, x1 - x0, y1 - y0],
        "area": float((x1 - x0) * (y1 - y0)),
        "iscrowd": 0,
        "segmentation": [[float(v) for xy in polygon for v in xy]],
    }


def write_coco(root: Path, num_images: int = 3) -> None:
    """COCO 2017 instances (COCO's 80 categories with their ids; objects of a few of them) and
    person keypoints (17 named keypoints per person), for train and val."""
    rng = np.random.default_rng(11)
    things = [c for c in COCO_CATEGORIES if c["isthing"]]
    categories = [{"id": c["id"], "name": c["name"], "supercategory": ""} for c in things]
    person = {
        **categories[0],
        "keypoints": list(COCO_PERSON_KEYPOINT_NAMES),
        "skeleton": [[16, 14], [14, 12]],
    }
    (root / "coco" / "annotations").mkdir(parents=True, exist_ok=True)
    for split in ("train2017", "val2017"):
        (root / "coco" / split).mkdir(parents=True, exist_ok=True)
        images, instances, people = [], [], []
        for image_id in range(1, num_images + 1):
            objects = _objects(rng, [0, 1 + image_id % 3])  # a person and one other class
            _draw(objects, rng).save(root / "coco" / split / f"{image_id:012d}.jpg", quality=95)
            images.append(
                {"id": image_id, "file_name": f"{image_id:012d}.jpg", "width": W, "height": H}
            )
            for c, polygon in objects:
                ann = _coco_annotation(len(instances) + 1, image_id, things[c]["id"], polygon)
                instances.append(ann)
                if c == 0:
                    x0, y0, x1, y1 = _box(polygon)
                    kx = rng.uniform(x0 + 1, x1 - 1, 17)
                    ky = np.sort(rng.uniform(y0 + 1, y1 - 1, 17))
                    keypoints = [float(v) for a, b in zip(kx, ky, strict=True) for v in (a, b, 2)]
                    people.append({**ann, "keypoints": keypoints, "num_keypoints": 17})
        for name, anns, cats in (
            ("instances", instances, categories),
            ("person_keypoints", people, [person]),
        ):
            path = root / "coco" / "annotations" / f"{name}_{split}.json"
            path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))


# ---------------------------------------------------------------------------------------------
# LVIS v1: lvis/lvis_v1_{train,val}.json over COCO 2017's images (found through coco_url)


def write_lvis(root: Path, num_images: int = 3) -> None:
    """LVIS v1 train/val: all 1203 categories with their frequency, image_count and
    instance_count; objects of a rare, a common and a frequent category in each image, and the
    per-image ``neg_category_ids`` / ``not_exhaustive_category_ids`` lists."""
    rng = np.random.default_rng(13)
    by_freq = {f: [c["id"] for c in LVIS_CATEGORIES if c["frequency"] == f] for f in "rcf"}
    used = [by_freq["r"][0], by_freq["c"][0], by_freq["f"][0]]
    (root / "lvis").mkdir(parents=True, exist_ok=True)
    for split in ("train2017", "val2017"):
        (root / "coco" / split).mkdir(parents=True, exist_ok=True)
        images, anns = [], []
        for image_id in range(1, num_images + 1):
            objects = _objects(rng, [0, 1, 2])
            name = f"{image_id + 1000:012d}.jpg"
            _draw(objects, rng).save(root / "coco" / split / name, quality=95)
            images.append({
                "id": image_id, "width": W, "height": H,
                "coco_url": f"http://images.cocodataset.org/{split}/{name}",
                "neg_category_ids": [by_freq["f"][1]], "not_exhaustive_category_ids": [],
            })  # fmt: skip
            for c, polygon in objects:
                anns.append(_coco_annotation(len(anns) + 1, image_id, used[c], polygon))
        categories = [
            {
                **c,
                "image_count": num_images if c["id"] in used else 0,
                "instance_count": num_images if c["id"] in used else 0,
            }
            for c in LVIS_CATEGORIES
        ]
        path = root / "lvis" / f"lvis_v1_{split.removesuffix('2017')}.json"
        path.write_text(
            json.dumps({"images": images, "annotations": anns, "categories": categories})
        )


# ---------------------------------------------------------------------------------------------
# Cityscapes: cityscapes/leftImg8bit/{split}/{city}/*_leftImg8bit.png and
# cityscapes/gtFine/{split}/{city}/*_gtFine_{instanceIds,labelIds,labelTrainIds}.png,
# *_gtFine_polygons.json

# Cityscapes label ids of three instance classes (cityscapesscripts.helpers.labels)
CITYSCAPES_LABELS = {"person": 24, "car": 26, "bicycle": 33}


def write_cityscapes(root: Path, num_images: int = 2) -> None:
    """Fine train and val of one city each: a person, a car and a bicycle per image, drawn into
    the image, the label-id, train-id and instance-id PNGs and the polygon JSON alike."""
    rng = np.random.default_rng(17)
    for split, city in (("train", "aachen"), ("val", "frankfurt")):
        image_dir = root / "cityscapes" / "leftImg8bit" / split / city
        gt_dir = root / "cityscapes" / "gtFine" / split / city
        image_dir.mkdir(parents=True, exist_ok=True)
        gt_dir.mkdir(parents=True, exist_ok=True)
        for k in range(num_images):
            base = f"{city}_000000_{k:06d}"
            objects = _objects(rng, [0, 1, 2])
            _draw(objects, rng).save(image_dir / f"{base}_leftImg8bit.png")
            label_ids = Image.new("L", (W, H), 7)  # road
            instance_ids = Image.new("I", (W, H), 7)
            polygons = []
            for n, ((_, polygon), (name, label)) in enumerate(
                zip(objects, CITYSCAPES_LABELS.items(), strict=True)
            ):
                ImageDraw.Draw(label_ids).polygon(polygon, fill=label)
                ImageDraw.Draw(instance_ids).polygon(polygon, fill=label * 1000 + n)
                polygons.append({"label": name, "polygon": [list(p) for p in polygon]})
            label_ids.save(gt_dir / f"{base}_gtFine_labelIds.png")
            train_ids = cityscapes_train_ids(np.asarray(label_ids))
            Image.fromarray(train_ids).save(gt_dir / f"{base}_gtFine_labelTrainIds.png")
            # 16-bit, as Cityscapes ships them (ids up to 33999)
            as_16_bit = Image.fromarray(np.asarray(instance_ids).astype(np.uint16))
            as_16_bit.save(gt_dir / f"{base}_gtFine_instanceIds.png")
            (gt_dir / f"{base}_gtFine_polygons.json").write_text(
                json.dumps({"imgHeight": H, "imgWidth": W, "objects": polygons})
            )
