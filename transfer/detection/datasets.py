"""Datasets: detectron2's builtin catalog (COCO, LVIS, Pascal VOC, Cityscapes, ADE20K, found
under ``$DETECTRON2_DATASETS``) and any COCO-format JSON registered with
:func:`register_coco_dataset` (``--register-coco``): classes from its ``categories`` (by id),
keypoints from ``categories[*].keypoints``, flip pairs from the ``left_X``/``right_X``
convention. :func:`check_datasets` names, before training, any missing file or folder,
unregistered dataset, test set without an evaluator, or config value that does not fit the data.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, Metadata, MetadataCatalog
from detectron2.data.datasets import register_coco_instances

from .config import DetectionSetupError, is_semantic
from .evaluation import check_evaluator_type
from .semantic import check_cityscapes_train_ids, check_sem_seg_classes

__all__ = [
    "check_datasets",
    "has_shapely",
    "infer_flip_pairs",
    "parse_flip_pairs",
    "register_coco_dataset",
]

_COCO_NUM_KEYPOINTS = 17  # pycocotools' default OKS sigmas cover COCO's 17 person keypoints


def parse_flip_pairs(text: str) -> list[tuple[str, str]]:
    """``"l_eye:r_eye,l_ear:r_ear"`` -> ``[("l_eye", "r_eye"), ("l_ear", "r_ear")]``."""
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) != 2 or not all(parts):
            raise DetectionSetupError(f"keypoint flip pair {item!r} is not of the form LEFT:RIGHT")
        pairs.append((parts[0], parts[1]))
    return pairs


def infer_flip_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs ``(left_X, right_X)`` present in ``names`` (COCO's keypoint naming convention)."""
    return [
        (n, "right_" + n[5:]) for n in names if n.startswith("left_") and "right_" + n[5:] in names
    ]


def _read_categories(name: str, json_file: str) -> list[dict]:
    try:
        with open(json_file) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise DetectionSetupError(f"dataset {name}: {json_file} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list):
        raise DetectionSetupError(f"dataset {name}: {json_file} has no 'categories' list")
    if not data["categories"]:
        raise DetectionSetupError(f"dataset {name}: {json_file} has an empty 'categories' list")
    return sorted(data["categories"], key=lambda c: c["id"])


def register_coco_dataset(
    name: str,
    json_file: str,
    image_root: str,
    flip_pairs: Sequence[tuple[str, str]] | None = None,
) -> None:
    """Register a COCO-format dataset under ``name`` for training and COCO evaluation (again
    with the same files: a no-op; anything else under ``name`` is an error)."""
    json_file, image_root = os.path.abspath(json_file), os.path.abspath(image_root)
    if name in DatasetCatalog.list():
        meta = MetadataCatalog.get(name)
        if (meta.get("json_file"), meta.get("image_root")) == (json_file, image_root):
            return
        raise DetectionSetupError(f"dataset name {name!r} is already registered; choose another")
    if not os.path.isfile(json_file):
        raise DetectionSetupError(f"dataset {name}: annotation file {json_file} does not exist")
    if not os.path.isdir(image_root):
        raise DetectionSetupError(f"dataset {name}: image folder {image_root} does not exist")
    cats = _read_categories(name, json_file)
    metadata: dict = {"thing_classes": [c["name"] for c in cats]}
    keypoint_sets = {tuple(c["keypoints"]) for c in cats if c.get("keypoints")}
    if len(keypoint_sets) > 1:
        raise DetectionSetupError(
            f"dataset {name}: categories in {json_file} define different keypoint lists; "
            "detectron2 needs a single keypoint set"
        )
    if keypoint_sets:
        names = list(next(iter(keypoint_sets)))
        pairs = list(flip_pairs) if flip_pairs is not None else infer_flip_pairs(names)
        unknown = sorted({n for pair in pairs for n in pair} - set(names))
        if unknown:
            raise DetectionSetupError(
                f"dataset {name}: flip pairs name keypoints not in {json_file}: {unknown}"
            )
        metadata.update(keypoint_names=names, keypoint_flip_map=pairs)
    register_coco_instances(name, metadata, json_file, image_root)


def _missing_file_hint(path: str) -> str:
    root = os.path.expanduser(os.getenv("DETECTRON2_DATASETS", "datasets"))
    if os.path.abspath(path).startswith(os.path.abspath(root) + os.sep):
        return f" (builtin datasets are found under $DETECTRON2_DATASETS, now {root!r})"
    return ""


# Metadata keys that name a dataset's files, as detectron2's registrations set them (COCO and
# LVIS: json_file/image_root; Pascal VOC: dirname; Cityscapes: image_dir/gt_dir; ADE20K and other
# semantic sets: sem_seg_root; VOC12-aug, registered here: split_file), with what must be there.
_PATH_KEYS = (
    ("json_file", "annotation file", os.path.isfile),
    ("image_root", "image folder", os.path.isdir),
    ("dirname", "folder", os.path.isdir),
    ("image_dir", "image folder", os.path.isdir),
    ("gt_dir", "annotation folder", os.path.isdir),
    ("sem_seg_root", "label folder", os.path.isdir),
    ("split_file", "split file", os.path.isfile),
)


def _dataset_paths(meta: Metadata) -> list[tuple[str, str, object]]:
    """``(path, what, exists)`` of every file or folder a registered dataset reads."""
    paths = [(meta.get(k), what, exists) for k, what, exists in _PATH_KEYS]
    if meta.get("evaluator_type") == "pascal_voc" and meta.get("dirname"):
        # detectron2's load_voc_instances reads the split's list, then one XML and JPEG per id
        root = meta.dirname
        paths += [
            (
                os.path.join(root, "ImageSets", "Main", f"{meta.split}.txt"),
                "split list",
                os.path.isfile,
            ),
            (os.path.join(root, "Annotations"), "annotation folder", os.path.isdir),
            (os.path.join(root, "JPEGImages"), "image folder", os.path.isdir),
        ]
    return [(p, what, exists) for p, what, exists in paths if p is not None]


def has_shapely() -> bool:
    """Whether ``shapely`` (detectron2's Cityscapes instance loader) can be imported."""
    return importlib.util.find_spec("shapely") is not None


def check_datasets(cfg: CfgNode, test_only: bool = False) -> None:
    """Raise :class:`DetectionSetupError` unless each dataset of ``cfg`` (``test_only``: of
    ``DATASETS.TEST``) is registered, has its files, fits the classes and keypoints, and (test
    sets) has an evaluator (:func:`~.evaluation.check_evaluator_type`)."""
    names = [] if test_only else list(cfg.DATASETS.TRAIN)
    for name in names + list(cfg.DATASETS.TEST):
        if name not in DatasetCatalog.list():
            raise DetectionSetupError(
                f"dataset {name!r} is not registered: use a builtin name such as coco_2017_train "
                "or register a COCO-format file with --register-coco NAME JSON IMAGE_ROOT"
            )
        meta = MetadataCatalog.get(name)
        for path, what, exists in _dataset_paths(meta):
            if not exists(path):
                raise DetectionSetupError(
                    f"dataset {name}: {what} {path} does not exist{_missing_file_hint(path)}"
                )
        if meta.get("evaluator_type") == "cityscapes_instance" and not has_shapely():
            raise DetectionSetupError(
                f"dataset {name}: detectron2's Cityscapes instance loader reads "
                "*_gtFine_polygons.json with shapely, which is not installed: pip install shapely "
                "(the project's setup installs it)"
            )
        if name in cfg.DATASETS.TEST:
            check_evaluator_type(name)
        if is_semantic(cfg):
            check_cityscapes_train_ids(name, meta)
            check_sem_seg_classes(cfg, name, meta)
        elif cfg.MODEL.META_ARCHITECTURE == "GeneralizedRCNN":
            _check_classes(cfg, name, meta)
        if cfg.MODEL.KEYPOINT_ON:
            _check_keypoints(cfg, name, meta)


def _check_classes(cfg: CfgNode, name: str, meta: Metadata) -> None:
    classes = meta.get("thing_classes")
    if classes is not None and len(classes) != cfg.MODEL.ROI_HEADS.NUM_CLASSES:
        raise DetectionSetupError(
            f"dataset {name} has {len(classes)} classes but MODEL.ROI_HEADS.NUM_CLASSES is "
            f"{cfg.MODEL.ROI_HEADS.NUM_CLASSES}; add MODEL.ROI_HEADS.NUM_CLASSES "
            f"{len(classes)} to the options"
        )


def _check_keypoints(cfg: CfgNode, name: str, meta: Metadata) -> None:
    names = meta.get("keypoint_names")
    if names is None:
        raise DetectionSetupError(
            f"dataset {name} has no keypoint names but MODEL.KEYPOINT_ON is True "
            "(its JSON categories need a 'keypoints' list)"
        )
    if len(names) != cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS:
        raise DetectionSetupError(
            f"dataset {name} has {len(names)} keypoints but MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS "
            f"is {cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS}"
        )
    sigmas = cfg.TEST.KEYPOINT_OKS_SIGMAS
    if len(sigmas) != len(names) and (sigmas or len(names) != _COCO_NUM_KEYPOINTS):
        raise DetectionSetupError(
            f"dataset {name} has {len(names)} keypoints: set TEST.KEYPOINT_OKS_SIGMAS to "
            f"{len(names)} values (COCO's defaults only cover {_COCO_NUM_KEYPOINTS})"
        )
