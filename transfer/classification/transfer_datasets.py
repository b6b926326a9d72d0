"""The 12 linear-transfer datasets of the paper (Sec. 6.1, Table 2), read from local copies.

Each dataset is built by a function registered in :data:`TRANSFER_DATASETS` (fvcore
``Registry``). Contract: ``builder(root: str, ctx: BuildContext) -> TransferData``; it must

* read ``root`` in the dataset's published layout (torchvision's classes with ``download=False``
  where they exist; :data:`LAYOUTS` documents each), never download, never create directories;
* return ``sources`` (the image sets whose features are extracted, each exactly once) and
  ``splits`` ``train`` / ``val`` / ``test`` as index arrays into those sources, disjoint;
* raise :class:`DatasetError` naming the root and the expected layout when something is missing.

Validation splits (the learning-rate sweep is selected on ``val``; the final classifier is
trained on ``train + val`` and scored on ``test``):

=============  ======================================================================
Aircraft       official ``train`` / ``val`` / ``test`` (variant level, 100 classes)
Birdsnap       per class, seeded: 5 val, 5 test, the remaining decodable images train
Caltech-101    per class, seeded: 30 train+val (``val_fraction`` of them val), rest test
Cars           official train (``val_fraction`` held out, stratified, seeded) / test
CIFAR-10/100   official train (``val_fraction`` held out) / test
DTD            official ``train1`` / ``val1`` / ``test1``
Flowers        official ``train`` / ``val`` / ``test``
Food-101       official train (``val_fraction`` held out) / test
Pets           official ``trainval`` (``val_fraction`` held out) / ``test``
Places365      ``train-standard`` (``val_fraction`` held out) / official ``val`` as test
SUN397         ``Training_01`` (``val_fraction`` held out) / ``Testing_01``
=============  ======================================================================
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from fvcore.common.registry import Registry
from torch.utils.data import Dataset, Subset
from torchvision import datasets as tvd
from tqdm import tqdm

from pretrain.data.datasets import ImageFolderSource, decodes
from pretrain.data.splits import per_class_split
from pretrain.utils.errors import DatasetError

__all__ = [
    "DATASET_NAMES",
    "LAYOUTS",
    "METRIC_OF",
    "TRANSFER_DATASETS",
    "BuildContext",
    "TransferData",
    "build_transfer_dataset",
    "stratified_holdout",
]

logger = logging.getLogger(__name__)

TRANSFER_DATASETS = Registry("TRANSFER_DATASETS")
TRANSFER_DATASETS.__doc__ = "Builders of the linear-transfer datasets; see the module docstring."

# key -> column name in the paper's Table 2, in the paper's order
DATASET_NAMES = {
    "aircraft": "Aircraft",
    "birdsnap": "Birdsnap",
    "caltech101": "Caltech-101",
    "cars": "Cars",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "dtd": "DTD",
    "flowers": "Flowers",
    "food": "Food",
    "pets": "Pets",
    "places365": "Place365",
    "sun397": "SUN397",
}
# Sec. 6.1: mean per-class accuracy for Aircraft, Caltech-101, Flowers, Pets; top-1 otherwise.
METRIC_OF = {k: "top1" for k in DATASET_NAMES} | {
    k: "mean_per_class" for k in ("aircraft", "caltech101", "flowers", "pets")
}

LAYOUTS = {
    "aircraft": "<root>/fgvc-aircraft-2013b/data/{images/,variants.txt,"
    "images_variant_{train,val,test}.txt}",
    "birdsnap": "<root>/images/<class>/<image>.jpg",
    "caltech101": "<root>/caltech101/101_ObjectCategories/<class>/image_NNNN.jpg",
    "cars": "<root>/stanford_cars/{devkit/cars_meta.mat,devkit/cars_train_annos.mat,"
    "cars_train/,cars_test/,cars_test_annos_withlabels.mat}",
    "cifar10": "<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}",
    "cifar100": "<root>/cifar-100-python/{train,test,meta}",
    "dtd": "<root>/dtd/dtd/{images/<class>/,labels/{train1,val1,test1}.txt}",
    "flowers": "<root>/flowers-102/{jpg/image_NNNNN.jpg,imagelabels.mat,setid.mat}",
    "food": "<root>/food-101/{images/<class>/,meta/{train,test}.json}",
    "pets": "<root>/oxford-iiit-pet/{images/,annotations/{trainval,test}.txt}",
    "places365": "<root>/{categories_places365.txt,places365_train_standard.txt,"
    "places365_val.txt,data_256_standard/ + val_256/ (or data_large_standard/ + val_large/)}",
    "sun397": "<root>/SUN397/{ClassName.txt,<letter>/<class>/sun_*.jpg} and "
    "{Training_01,Testing_01}.txt of Partitions.zip in <root>/SUN397/Partitions/ "
    "or <root>/Partitions/",
}

# Private attribute holding the labels of each torchvision class (read without decoding images).
_LABEL_ATTRS = (
    (tvd.CIFAR10, "targets"),  # CIFAR100 subclasses CIFAR10
    (tvd.Places365, "targets"),
    (tvd.Caltech101, "y"),
    (tvd.FGVCAircraft, "_labels"),
    (tvd.DTD, "_labels"),
    (tvd.Flowers102, "_labels"),
    (tvd.Food101, "_labels"),
    (tvd.OxfordIIITPet, "_labels"),
    (tvd.SUN397, "_labels"),
    (ImageFolderSource, "targets"),
)


@dataclass
class BuildContext:
    seed: int = 0
    val_fraction: float = 0.2
    cache_dir: str = ""  # where Birdsnap's list of decodable images is remembered


@dataclass
class TransferData:
    """Image sources and the train / val / test index splits into them."""

    key: str
    root: str
    num_classes: int
    sources: dict[str, Dataset]
    labels: dict[str, np.ndarray]
    splits: dict[str, list[tuple[str, np.ndarray]]]  # split -> [(source, indices)]
    val_protocol: str
    classes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return DATASET_NAMES[self.key]

    @property
    def metric(self) -> str:
        return METRIC_OF[self.key]

    def split_size(self, split: str) -> int:
        return sum(len(idx) for _, idx in self.splits[split])


def build_transfer_dataset(key: str, root: str, ctx: BuildContext | None = None) -> TransferData:
    """Build dataset ``key`` (see :data:`DATASET_NAMES`) from ``root`` and check its splits."""
    if key not in DATASET_NAMES:
        raise ValueError(f"unknown transfer dataset {key!r}; known: {list(DATASET_NAMES)}")
    if not root or not os.path.isdir(root):
        raise DatasetError(f"{key}: dataset root {root!r} does not exist; expected {LAYOUTS[key]}")
    data = TRANSFER_DATASETS.get(key)(root, ctx or BuildContext())
    _validate(data)
    return data


def _validate(data: TransferData) -> None:
    seen: dict[str, set[int]] = {}
    for split in ("train", "val", "test"):
        if data.split_size(split) == 0:
            raise DatasetError(f"{data.key}: {data.root}: the {split} split is empty")
        for src, idx in data.splits[split]:
            used = seen.setdefault(src, set())
            if used & set(idx.tolist()):
                raise DatasetError(f"{data.key}: {split} overlaps another split in {src}")
            used |= set(idx.tolist())
    for src, lab in data.labels.items():
        if len(lab) and (lab.min() < 0 or lab.max() >= data.num_classes):
            raise DatasetError(
                f"{data.key}: {data.root}: labels of {src} outside [0, {data.num_classes})"
            )


def _tv(key: str, cls: type, root: str, **kwargs) -> Dataset:
    """Construct torchvision's ``cls`` with ``download=False``; errors name root and layout."""
    try:
        return cls(root, download=False, **kwargs)
    except (RuntimeError, OSError, KeyError, ValueError, IndexError) as e:
        raise DatasetError(
            f"{key}: cannot read {root!r} with torchvision {cls.__name__}({kwargs}): {e}; "
            f"expected {LAYOUTS[key]}"
        ) from None


def _labels(ds: Dataset) -> np.ndarray:
    if isinstance(ds, Subset):
        return _labels(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    if isinstance(ds, tvd.StanfordCars):
        return np.asarray([label for _, label in ds._samples], dtype=np.int64)
    for cls, attr in _LABEL_ATTRS:
        if isinstance(ds, cls):
            return np.asarray(getattr(ds, attr), dtype=np.int64)
    raise TypeError(f"no label accessor for {type(ds).__name__}")


def stratified_holdout(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, held_out)`` indices: round(fraction * n_c) of each class c held out (seeded).

    Every class keeps at least one training image; classes with one image hold out none.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    held, keep = per_class_split(labels, lambda n: [min(int(round(fraction * n)), n - 1)], seed)
    return keep, held


def _make(
    key: str,
    root: str,
    sources: dict[str, Dataset],
    num_classes: int,
    splits: Mapping[str, Sequence[tuple[str, np.ndarray]]],
    protocol: str,
    classes: Sequence[str] = (),
) -> TransferData:
    labels = {name: _labels(ds) for name, ds in sources.items()}
    splits = {
        s: [(src, np.asarray(idx, dtype=np.int64)) for src, idx in parts]
        for s, parts in splits.items()
    }
    return TransferData(key, root, num_classes, sources, labels, splits, protocol, list(classes))


def _official_val(
    key: str, root: str, cls: type[Dataset], names: tuple[str, str, str], **kw
) -> TransferData:
    """Datasets with an official train / val / test split."""
    srcs = {n: _tv(key, cls, root, split=n, **kw) for n in names}
    classes = list(srcs[names[0]].classes)
    for n in names[1:]:
        if list(srcs[n].classes) != classes:
            raise DatasetError(f"{key}: {root}: split {n} has other classes than {names[0]}")
    splits = {
        s: [(n, np.arange(len(srcs[n])))]
        for s, n in zip(("train", "val", "test"), names, strict=True)
    }
    return _make(key, root, srcs, len(classes), splits, f"official {'/'.join(names)}", classes)


def _heldout_val(
    key: str,
    root: str,
    train_ds: Dataset,
    test_ds: Dataset,
    ctx: BuildContext,
    classes: Sequence[str],
) -> TransferData:
    """Datasets with only train / test: hold out ``val_fraction`` of train, stratified."""
    srcs = {"train": train_ds, "test": test_ds}
    keep, held = stratified_holdout(_labels(train_ds), ctx.val_fraction, ctx.seed)
    splits = {
        "train": [("train", keep)],
        "val": [("train", held)],
        "test": [("test", np.arange(len(test_ds)))],
    }
    protocol = f"val = {ctx.val_fraction:.0%} of train per class (seed {ctx.seed})"
    return _make(key, root, srcs, len(classes), splits, protocol, classes)


@TRANSFER_DATASETS.register()
def aircraft(root: str, ctx: BuildContext) -> TransferData:
    return _official_val("aircraft", root, tvd.FGVCAircraft, ("train", "val", "test"))


@TRANSFER_DATASETS.register()
def dtd(root: str, ctx: BuildContext) -> TransferData:
    return _official_val("dtd", root, tvd.DTD, ("train", "val", "test"), partition=1)


@TRANSFER_DATASETS.register()
def flowers(root: str, ctx: BuildContext) -> TransferData:
    srcs = {n: _tv("flowers", tvd.Flowers102, root, split=n) for n in ("train", "val", "test")}
    splits = {n: [(n, np.arange(len(ds)))] for n, ds in srcs.items()}
    return _make("flowers", root, srcs, 102, splits, "official train/val/test")


# Datasets that torchvision reads as a train and a test split, val held out of train.
# key: (torchvision class, the argument that picks the split, its train and test values)
_TRAIN_TEST = {
    "cars": (tvd.StanfordCars, "split", ("train", "test")),
    "cifar10": (tvd.CIFAR10, "train", (True, False)),
    "cifar100": (tvd.CIFAR100, "train", (True, False)),
    "pets": (tvd.OxfordIIITPet, "split", ("trainval", "test")),
}


def _train_test_builder(
    key: str, cls: type, arg: str, values: tuple
) -> Callable[[str, BuildContext], TransferData]:
    def build(root: str, ctx: BuildContext) -> TransferData:
        tr, te = (_tv(key, cls, root, **{arg: v}) for v in values)
        return _heldout_val(key, root, tr, te, ctx, tr.classes)

    build.__name__ = build.__qualname__ = key  # the name the registry files it under
    return build


for _key, _spec in _TRAIN_TEST.items():
    TRANSFER_DATASETS.register(_train_test_builder(_key, *_spec))


@TRANSFER_DATASETS.register()
def food(root: str, ctx: BuildContext) -> TransferData:
    tr, te = (_tv("food", tvd.Food101, root, split=s) for s in ("train", "test"))
    if tr.classes != te.classes:
        raise DatasetError(f"food: {root}: train.json and test.json list different classes")
    return _heldout_val("food", root, tr, te, ctx, tr.classes)


@TRANSFER_DATASETS.register()
def places365(root: str, ctx: BuildContext) -> TransferData:
    if os.path.isdir(os.path.join(root, "data_256_standard")):
        small = True
    elif os.path.isdir(os.path.join(root, "data_large_standard")):
        small = False
    else:
        raise DatasetError(
            f"places365: {root}: neither data_256_standard/ nor data_large_standard/ found; "
            f"expected {LAYOUTS['places365']}"
        )
    tr, te = (
        _tv("places365", tvd.Places365, root, split=s, small=small)
        for s in ("train-standard", "val")
    )
    data = _heldout_val("places365", root, tr, te, ctx, tr.classes)
    data.val_protocol += "; test = official val"
    return data


@TRANSFER_DATASETS.register()
def caltech101(root: str, ctx: BuildContext) -> TransferData:
    # torchvision's Caltech101 makedirs(<root>/caltech101) before checking; check first instead
    if not os.path.isdir(os.path.join(root, "caltech101", "101_ObjectCategories")):
        raise DatasetError(f"caltech101: {root}: expected {LAYOUTS['caltech101']}")
    ds = _tv("caltech101", tvd.Caltech101, root)
    labels = _labels(ds)
    trainval, test = per_class_split(labels, [30], ctx.seed)
    keep, held = stratified_holdout(labels[trainval], ctx.val_fraction, ctx.seed)
    splits = {
        "train": [("all", trainval[keep])],
        "val": [("all", trainval[held])],
        "test": [("all", test)],
    }
    protocol = (
        f"30 images per class train+val (val = {ctx.val_fraction:.0%}), rest test (seed {ctx.seed})"
    )
    return _make(
        "caltech101", root, {"all": ds}, len(ds.categories), splits, protocol, ds.categories
    )


@TRANSFER_DATASETS.register()
def sun397(root: str, ctx: BuildContext) -> TransferData:
    ds = _tv("sun397", tvd.SUN397, root)
    base = os.path.join(root, "SUN397")
    index = {
        "/" + os.path.relpath(str(p), base).replace(os.sep, "/"): i
        for i, p in enumerate(ds._image_files)
    }
    parts = {}
    for name in ("Training_01", "Testing_01"):
        # Partitions.zip holds flat Training_NN.txt / Testing_NN.txt files; accept it unpacked
        # into <root>/SUN397/Partitions/ or <root>/Partitions/.
        candidates = [os.path.join(d, "Partitions", f"{name}.txt") for d in (base, root)]
        path = next((c for c in candidates if os.path.isfile(c)), "")
        if not path:
            missing = " or ".join(candidates)
            raise DatasetError(
                f"sun397: missing split file {missing}; expected {LAYOUTS['sun397']}"
            )
        with open(path) as f:
            listed = [line.strip() for line in f if line.strip()]
        missing = [p for p in listed if p not in index]
        if missing:
            raise DatasetError(
                f"sun397: {path} lists {len(missing)} images absent under {base}, e.g. {missing[0]}"
            )
        parts[name] = Subset(ds, [index[p] for p in listed])
    data = _heldout_val(
        "sun397", root, parts["Training_01"], parts["Testing_01"], ctx, list(ds.classes)
    )
    data.val_protocol = "Training_01 / Testing_01; " + data.val_protocol
    return data


def _decodable(paths: list[str], cache_dir: str) -> list[bool]:
    """Which images decode (:func:`pretrain.data.datasets.decodes`); remembered in
    ``cache_dir`` keyed by paths and sizes."""
    sig = hashlib.sha256(json.dumps([(p, os.path.getsize(p)) for p in paths]).encode()).hexdigest()[
        :24
    ]
    memo = os.path.join(cache_dir, f"birdsnap-decodable-{sig}.json") if cache_dir else ""
    if memo and os.path.isfile(memo):
        with open(memo) as f:
            return json.load(f)
    desc = "birdsnap: checking images decode"
    ok = [decodes(p) for p in tqdm(paths, desc=desc, unit="img", dynamic_ncols=True)]
    if memo:
        os.makedirs(cache_dir, exist_ok=True)
        with open(memo, "w") as f:
            json.dump(ok, f)
    return ok


@TRANSFER_DATASETS.register()
def birdsnap(root: str, ctx: BuildContext) -> TransferData:
    images = os.path.join(root, "images")
    if not os.path.isdir(images):
        raise DatasetError(f"birdsnap: {images} does not exist; expected {LAYOUTS['birdsnap']}")
    try:
        ds = ImageFolderSource(images, extensions=(".jpg", ".jpeg", ".png"))
    except DatasetError as e:
        raise DatasetError(f"birdsnap: {e}; expected {LAYOUTS['birdsnap']}") from None
    ok = _decodable([p for p, _ in ds.samples], ctx.cache_dir)
    if not all(ok):
        logger.warning("birdsnap: %d images do not decode and are skipped", ok.count(False))
    ds.keep(ok)
    val, test, train = per_class_split(_labels(ds), [5, 5], ctx.seed)
    splits = {"train": [("all", train)], "val": [("all", val)], "test": [("all", test)]}
    protocol = f"per class 5 val + 5 test (seed {ctx.seed}), rest of the decodable images train"
    return _make("birdsnap", root, {"all": ds}, len(ds.classes), splits, protocol, ds.classes)


def source_digest(data: TransferData, source: str) -> dict:
    """Identity of one source for the feature-cache key (size and labels, not image bytes)."""
    lab = torch.as_tensor(data.labels[source])
    return {
        "root": os.path.abspath(data.root),
        "num": int(lab.numel()),
        "labels": hashlib.sha256(lab.numpy().tobytes()).hexdigest()[:16],
    }
