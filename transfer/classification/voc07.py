"""PASCAL VOC2007 classification: the 20-class multi-label task read from the VOC2007 folder and
its two published average precisions.

Labels follow the devkit's per-class files (``ImageSets/Main/<class>_<split>.txt``: 1 present, -1
absent, 0 only difficult objects), stored as :data:`POSITIVE` 1, :data:`NEGATIVE` 0 and
:data:`DIFFICULT` -1 (VISSL's ``create_voc_data_files.py`` encoding, which the SVM benchmark
reads). Both APs leave difficult images out of the class they are difficult for, as the devkit's
``VOCevalcls.m`` does (neither true nor false positives):

* :func:`voc07_ap11`: VOC2007 devkit's 11-point interpolated AP (mean of the highest precision
  at recall >= 0, 0.1, ..., 1), the metric Kornblith et al. (2019) and SimCLR report for
  VOC2007 in the 12-dataset transfer (``metric="map11"`` of the harness);
* :func:`voc_area_ap`: the area under the monotone precision envelope (the devkit of VOC2010
  on), which the VOC07 SVM benchmark computes (VISSL ``svm_utils/evaluate.py``, after Goyal et
  al. 2019's ``fair_self_supervision_benchmark``).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from pretrain.utils.errors import DatasetError

__all__ = [
    "DIFFICULT",
    "NEGATIVE",
    "POSITIVE",
    "VOC_CLASSES",
    "VOC_LAYOUT",
    "VOCImages",
    "read_voc_split",
    "voc07_ap11",
    "voc_area_ap",
    "voc_map",
]

# The devkit's class order (alphabetical), the columns of every label matrix.
VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
POSITIVE, NEGATIVE, DIFFICULT = 1, 0, -1
VOC_LAYOUT = (
    "<root>/{Annotations/<id>.xml, JPEGImages/<id>.jpg, "
    "ImageSets/Main/{train,val,trainval,test}.txt (+ <class>_<split>.txt)} (the VOC2007 folder)"
)


def _annotation_labels(path: str) -> np.ndarray:
    """(20,) labels of one ``Annotations/<id>.xml``: present if any non-difficult object of the
    class, difficult if only difficult ones, absent otherwise (how the devkit's per-class files
    are made). The standard library's ElementTree: torchvision's ``VOCDetection`` wants the
    ``VOCdevkit/VOC2007`` wrapper and returns a dict per image, no labels."""
    try:
        objects = ET.parse(path).getroot().findall("object")
    except (OSError, ET.ParseError) as e:
        raise DatasetError(f"voc2007: cannot read {path}: {e}") from None
    labels = np.full(len(VOC_CLASSES), NEGATIVE, dtype=np.int64)
    for obj in objects:
        name = (obj.findtext("name") or "").strip()
        if name not in VOC_CLASSES:
            raise DatasetError(f"voc2007: {path}: object class {name!r} is not a VOC class")
        c = VOC_CLASSES.index(name)
        if (obj.findtext("difficult") or "0").strip() == "1":
            if labels[c] == NEGATIVE:
                labels[c] = DIFFICULT
        else:
            labels[c] = POSITIVE
    return labels


def _read_lines(path: str) -> list[list[str]]:
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def read_voc_split(root: str, split: str) -> tuple[list[str], np.ndarray]:
    """Image ids of ``ImageSets/Main/<split>.txt`` and their (N, 20) labels from
    ``Annotations/``; where the per-class files ``<class>_<split>.txt`` are there, each must
    agree (a mismatch names the file and image)."""
    main = os.path.join(root, "ImageSets", "Main")
    listing = os.path.join(main, f"{split}.txt")
    if not os.path.isfile(listing):
        raise DatasetError(f"voc2007: {listing} does not exist; expected {VOC_LAYOUT}")
    ids = [parts[0] for parts in _read_lines(listing)]
    if not ids:
        raise DatasetError(f"voc2007: {listing} lists no image")
    labels = np.stack(
        [_annotation_labels(os.path.join(root, "Annotations", f"{i}.xml")) for i in ids]
    )
    row = {img: n for n, img in enumerate(ids)}
    devkit = {1: POSITIVE, -1: NEGATIVE, 0: DIFFICULT}
    for c, name in enumerate(VOC_CLASSES):
        per_class = os.path.join(main, f"{name}_{split}.txt")
        if not os.path.isfile(per_class):
            continue
        for parts in _read_lines(per_class):
            img, value = parts[0], int(parts[1])
            if img not in row or devkit.get(value) != labels[row[img], c]:
                raise DatasetError(
                    f"voc2007: {per_class}: {img} {value} disagrees with Annotations/{img}.xml "
                    f"or {split}.txt"
                )
    for i in ids:
        if not os.path.isfile(os.path.join(root, "JPEGImages", f"{i}.jpg")):
            raise DatasetError(f"voc2007: {root}/JPEGImages/{i}.jpg is missing")
    return ids, labels


class VOCImages(Dataset):
    """The images of one VOC2007 split: ``(PIL image, (20,) int64 labels)``; ``targets`` holds
    the (N, 20) label matrix (read without decoding images)."""

    def __init__(self, root: str, split: str, transform: Callable | None = None) -> None:
        self.root = root
        self.split = split
        self.ids, self.targets = read_voc_split(root, split)
        self.classes = list(VOC_CLASSES)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[object, np.ndarray]:
        path = os.path.join(self.root, "JPEGImages", f"{self.ids[index]}.jpg")
        with Image.open(path) as img:
            image = img.convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]


def _ranked(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Precision and recall down the ranking of ``scores`` (descending), difficult left out."""
    keep = labels != DIFFICULT
    scores, labels = scores[keep], labels[keep]
    npos = int((labels == POSITIVE).sum())
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(labels[order] == POSITIVE)
    fp = np.cumsum(labels[order] != POSITIVE)
    recall = tp / max(npos, 1)
    precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return precision, recall, npos


def voc07_ap11(scores: np.ndarray, labels: np.ndarray) -> float:
    """VOC2007 devkit ``VOCevalcls.m``: mean over t = 0, 0.1, ..., 1 of the highest precision at
    recall >= t (0 where none); ``labels`` of one class in {1, 0, -1}."""
    precision, recall, npos = _ranked(np.asarray(scores, float), np.asarray(labels))
    if npos == 0:
        raise ValueError("no positive image: the AP of this class is undefined")
    ap = 0.0
    for t in np.linspace(0.0, 1.0, 11):
        above = precision[recall >= t]
        ap += (above.max() if above.size else 0.0) / 11.0
    return float(ap)


def voc_area_ap(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the precision envelope (precision made non-increasing from the right),
    summed where recall changes: VISSL's ``calculate_ap`` and the VOC2010+ devkit."""
    precision, recall, npos = _ranked(np.asarray(scores, float), np.asarray(labels))
    if npos == 0:
        raise ValueError("no positive image: the AP of this class is undefined")
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.nonzero(mrec[1:] != mrec[:-1])[0] + 1
    return float(np.sum((mrec[steps] - mrec[steps - 1]) * mpre[steps]))


def voc_map(scores: np.ndarray, labels: np.ndarray, ap: str = "ap11") -> tuple[float, list[float]]:
    """Mean AP over classes (and the per-class APs) of (N, C) ``scores`` against (N, C)
    ``labels``; ``ap``: ``"ap11"`` (:func:`voc07_ap11`) or ``"area"`` (:func:`voc_area_ap`)."""
    fn = {"ap11": voc07_ap11, "area": voc_area_ap}[ap]
    scores, labels = np.asarray(scores), np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 2:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be (N, C) alike")
    per_class = [fn(scores[:, c], labels[:, c]) for c in range(labels.shape[1])]
    return float(np.mean(per_class)), per_class
