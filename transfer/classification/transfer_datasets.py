"""The 12 linear-transfer datasets of the paper (Sec. 6.1, Table 2) and VOC2007 (Kornblith et
al.'s list has it where the paper has Places365), read from local copies.

Each dataset is a :class:`TransferDataset` record in :data:`TRANSFER_DATASETS` (fvcore
``Registry``, keyed by the name ``TRANSFER.DATASETS`` uses), registered in Table 2's order by
:func:`transfer_dataset` on its builder. Contract: ``builder(root, ctx) -> TransferData`` reads
``root`` in the published layout (torchvision with ``download=False`` where it can), never
downloads or creates directories, returns disjoint ``train`` / ``val`` / ``test`` index splits
into its ``sources``, and raises :class:`DatasetError` naming the root and the expected layout.
The validation split of each dataset: docs/evaluation.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from fvcore.common.registry import Registry
from torch.utils.data import Dataset, Subset
from torchvision import datasets as tvd

from pretrain.data.datasets import ImageFolderSource, decodes
from pretrain.data.splits import per_class_split
from pretrain.utils.errors import DatasetError
from pretrain.utils.progress import progress

from .metrics import METRICS
from .voc07 import VOC_CLASSES, VOC_LAYOUT, VOCImages

__all__ = [
    "ALL_DATASET_NAMES",
    "DATASET_NAMES",
    "paper_datasets",
    "TRANSFER_DATASETS",
    "BuildContext",
    "TransferData",
    "TransferDataset",
    "build_transfer_dataset",
    "stratified_holdout",
    "transfer_dataset",
]

logger = logging.getLogger(__name__)

TRANSFER_DATASETS = Registry("TRANSFER_DATASETS")
TRANSFER_DATASETS.__doc__ = (
    "The linear-transfer datasets (TransferDataset records); see the module."
)

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
    (VOCImages, "targets"),  # (N, 20) multi-label matrix
)


@dataclass
class BuildContext:
    seed: int = 0
    val_fraction: float = 0.2
    cache_dir: str = ""  # where Birdsnap's list of decodable images is remembered


Builder = Callable[[str, BuildContext], "TransferData"]


@dataclass(frozen=True)
class TransferDataset:
    """Everything the harness knows of one downstream dataset."""

    key: str  # the config's name (TRANSFER.DATASETS, TRANSFER.ROOTS.<KEY>, TRANSFER.BUDGET.<KEY>)
    name: str  # its column in the paper's Table 2
    layout: str  # what build reads under the root, quoted by every error about it
    build: Builder
    # Sec. 6.1: mean per-class accuracy for Aircraft, Caltech-101, Flowers, Pets; top-1 otherwise
    metric: str = "top1"
    iters: int = 30000  # the default budget, TRANSFER.BUDGET.<KEY> (exactly one non-zero)
    epochs: int = 0
    paper: bool = True  # one of the paper's 12 Table 2 datasets (TRANSFER.DATASETS' default)

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"dataset {self.key!r}: metric {self.metric!r}, choose from {METRICS}")
        if (self.iters > 0) == (self.epochs > 0):
            raise ValueError(
                f"dataset {self.key!r}: iters {self.iters}, epochs {self.epochs}: "
                "exactly one must be > 0"
            )


def transfer_dataset(
    name: str,
    layout: str,
    *,
    metric: str = "top1",
    iters: int = 30000,
    epochs: int = 0,
    paper: bool = True,
) -> Callable[[Builder], Builder]:
    """Register the decorated builder as dataset ``builder.__name__`` with its record."""

    def register(build: Builder) -> Builder:
        record = TransferDataset(build.__name__, name, layout, build, metric, iters, epochs, paper)
        # fvcore's register() keys by __name__, which a record has not (as PRIOR_REGISTRY)
        TRANSFER_DATASETS._do_register(record.key, record)
        return build

    return register


def _layout(key: str) -> str:
    return TRANSFER_DATASETS.get(key).layout


class _Names(Mapping[str, str]):
    """Key -> Table 2 column name of every registered dataset (``paper_only``: of the paper's
    12), in registration (Table 2) order, read through to :data:`TRANSFER_DATASETS`."""

    def __init__(self, paper_only: bool) -> None:
        self.paper_only = paper_only

    def _keys(self) -> list[str]:
        return [k for k, r in TRANSFER_DATASETS if r.paper or not self.paper_only]

    def __getitem__(self, key: str) -> str:
        if key not in self._keys():
            raise KeyError(key)
        return TRANSFER_DATASETS.get(key).name

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


# The paper's 12 (Table 2's columns, TRANSFER.DATASETS' default) and every registered dataset.
DATASET_NAMES: Mapping[str, str] = _Names(paper_only=True)
ALL_DATASET_NAMES: Mapping[str, str] = _Names(paper_only=False)


def paper_datasets() -> list[str]:
    """The keys of the paper's 12 Table 2 datasets (``TRANSFER.DATASETS``' default)."""
    return list(DATASET_NAMES)


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
        return TRANSFER_DATASETS.get(self.key).name

    @property
    def metric(self) -> str:
        return TRANSFER_DATASETS.get(self.key).metric

    def split_size(self, split: str) -> int:
        return sum(len(idx) for _, idx in self.splits[split])


def build_transfer_dataset(key: str, root: str, ctx: BuildContext | None = None) -> TransferData:
    """Build the registered dataset ``key`` from ``root`` and check its splits."""
    if key not in TRANSFER_DATASETS:
        raise ValueError(f"unknown transfer dataset {key!r}; known: {list(ALL_DATASET_NAMES)}")
    dataset = TRANSFER_DATASETS.get(key)
    if not root or not os.path.isdir(root):
        raise DatasetError(
            f"{key}: dataset root {root!r} does not exist; expected {dataset.layout}"
        )
    data = dataset.build(root, ctx or BuildContext())
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
        if lab.ndim == 2:  # multi-label: (N, num_classes) in {1, 0, -1 difficult}
            if lab.shape[1] != data.num_classes or not np.isin(lab, (-1, 0, 1)).all():
                raise DatasetError(f"{data.key}: {data.root}: labels of {src} are not (N, C) ±1/0")
        elif len(lab) and (lab.min() < 0 or lab.max() >= data.num_classes):
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
            f"expected {_layout(key)}"
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


def _train_test(
    key: str, root: str, ctx: BuildContext, cls: type, arg: str, values: tuple
) -> TransferData:
    """Datasets that torchvision reads as a train and a test split (``arg`` = each of
    ``values``), val held out of train."""
    tr, te = (_tv(key, cls, root, **{arg: v}) for v in values)
    return _heldout_val(key, root, tr, te, ctx, tr.classes)


def _decodable(paths: list[str], cache_dir: str) -> list[bool]:
    """Which images decode (:func:`pretrain.data.datasets.decodes`); remembered in
    ``cache_dir`` keyed by paths and sizes."""
    listing = json.dumps([(p, os.path.getsize(p)) for p in paths])
    sig = hashlib.sha256(listing.encode()).hexdigest()[:24]
    memo = os.path.join(cache_dir, f"birdsnap-decodable-{sig}.json") if cache_dir else ""
    if memo and os.path.isfile(memo):
        with open(memo) as f:
            return json.load(f)
    desc = "birdsnap: checking images decode"
    ok = [decodes(p) for p in progress(paths, desc=desc, unit="img")]
    if memo:
        os.makedirs(cache_dir, exist_ok=True)
        with open(memo, "w") as f:
            json.dump(ok, f)
    return ok


# The datasets, in the order of the paper's Table 2.


@transfer_dataset(
    "Aircraft",
    "<root>/fgvc-aircraft-2013b/data/{images/,variants.txt,images_variant_{train,val,test}.txt}",
    metric="mean_per_class",
    iters=5000,
)
def aircraft(root: str, ctx: BuildContext) -> TransferData:
    return _official_val("aircraft", root, tvd.FGVCAircraft, ("train", "val", "test"))


@transfer_dataset("Birdsnap", "<root>/images/<class>/<image>.jpg")
def birdsnap(root: str, ctx: BuildContext) -> TransferData:
    images = os.path.join(root, "images")
    if not os.path.isdir(images):
        raise DatasetError(f"birdsnap: {images} does not exist; expected {_layout('birdsnap')}")
    try:
        ds = ImageFolderSource(images, extensions=(".jpg", ".jpeg", ".png"))
    except DatasetError as e:
        raise DatasetError(f"birdsnap: {e}; expected {_layout('birdsnap')}") from None
    ok = _decodable([p for p, _ in ds.samples], ctx.cache_dir)
    if not all(ok):
        logger.warning("birdsnap: %d images do not decode and are skipped", ok.count(False))
    ds.keep(ok)
    val, test, train = per_class_split(_labels(ds), [5, 5], ctx.seed)
    splits = {"train": [("all", train)], "val": [("all", val)], "test": [("all", test)]}
    protocol = f"per class 5 val + 5 test (seed {ctx.seed}), rest of the decodable images train"
    return _make("birdsnap", root, {"all": ds}, len(ds.classes), splits, protocol, ds.classes)


@transfer_dataset(
    "Caltech-101",
    "<root>/caltech101/101_ObjectCategories/<class>/image_NNNN.jpg",
    metric="mean_per_class",
    iters=5000,
)
def caltech101(root: str, ctx: BuildContext) -> TransferData:
    # torchvision's Caltech101 makedirs(<root>/caltech101) before checking; check first instead
    if not os.path.isdir(os.path.join(root, "caltech101", "101_ObjectCategories")):
        raise DatasetError(f"caltech101: {root}: expected {_layout('caltech101')}")
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


@transfer_dataset(
    "Cars",
    "<root>/stanford_cars/{devkit/cars_meta.mat,devkit/cars_train_annos.mat,"
    "cars_train/,cars_test/,cars_test_annos_withlabels.mat}",
)
def cars(root: str, ctx: BuildContext) -> TransferData:
    return _train_test("cars", root, ctx, tvd.StanfordCars, "split", ("train", "test"))


@transfer_dataset("CIFAR10", "<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}")
def cifar10(root: str, ctx: BuildContext) -> TransferData:
    return _train_test("cifar10", root, ctx, tvd.CIFAR10, "train", (True, False))


@transfer_dataset("CIFAR100", "<root>/cifar-100-python/{train,test,meta}")
def cifar100(root: str, ctx: BuildContext) -> TransferData:
    return _train_test("cifar100", root, ctx, tvd.CIFAR100, "train", (True, False))


@transfer_dataset(
    "DTD", "<root>/dtd/dtd/{images/<class>/,labels/{train1,val1,test1}.txt}", iters=5000
)
def dtd(root: str, ctx: BuildContext) -> TransferData:
    return _official_val("dtd", root, tvd.DTD, ("train", "val", "test"), partition=1)


@transfer_dataset(
    "Flowers",
    "<root>/flowers-102/{jpg/image_NNNNN.jpg,imagelabels.mat,setid.mat}",
    metric="mean_per_class",
    iters=5000,
)
def flowers(root: str, ctx: BuildContext) -> TransferData:
    srcs = {n: _tv("flowers", tvd.Flowers102, root, split=n) for n in ("train", "val", "test")}
    splits = {n: [(n, np.arange(len(ds)))] for n, ds in srcs.items()}
    return _make("flowers", root, srcs, 102, splits, "official train/val/test")


@transfer_dataset("Food", "<root>/food-101/{images/<class>/,meta/{train,test}.json}")
def food(root: str, ctx: BuildContext) -> TransferData:
    tr, te = (_tv("food", tvd.Food101, root, split=s) for s in ("train", "test"))
    if tr.classes != te.classes:
        raise DatasetError(f"food: {root}: train.json and test.json list different classes")
    return _heldout_val("food", root, tr, te, ctx, tr.classes)


@transfer_dataset(
    "Pets",
    "<root>/oxford-iiit-pet/{images/,annotations/{trainval,test}.txt}",
    metric="mean_per_class",
    iters=5000,
)
def pets(root: str, ctx: BuildContext) -> TransferData:
    return _train_test("pets", root, ctx, tvd.OxfordIIITPet, "split", ("trainval", "test"))


@transfer_dataset(
    "Place365",
    "<root>/{categories_places365.txt,places365_train_standard.txt,"
    "places365_val.txt,data_256_standard/ + val_256/ (or data_large_standard/ + val_large/)}",
    iters=0,
    epochs=100,
)
def places365(root: str, ctx: BuildContext) -> TransferData:
    if os.path.isdir(os.path.join(root, "data_256_standard")):
        small = True
    elif os.path.isdir(os.path.join(root, "data_large_standard")):
        small = False
    else:
        raise DatasetError(
            f"places365: {root}: neither data_256_standard/ nor data_large_standard/ found; "
            f"expected {_layout('places365')}"
        )
    tr, te = (
        _tv("places365", tvd.Places365, root, split=s, small=small)
        for s in ("train-standard", "val")
    )
    data = _heldout_val("places365", root, tr, te, ctx, tr.classes)
    data.val_protocol += "; test = official val"
    return data


@transfer_dataset(
    "SUN397",
    "<root>/SUN397/{ClassName.txt,<letter>/<class>/sun_*.jpg} and "
    "{Training_01,Testing_01}.txt of Partitions.zip in <root>/SUN397/Partitions/ "
    "or <root>/Partitions/",
)
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
                f"sun397: missing split file {missing}; expected {_layout('sun397')}"
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


@transfer_dataset("VOC2007", VOC_LAYOUT, metric="map11", iters=5000, paper=False)
def voc2007(root: str, ctx: BuildContext) -> TransferData:
    # Official train / val / test; 11-point mAP with difficult images left out (.voc07).
    for sub in ("Annotations", "JPEGImages", os.path.join("ImageSets", "Main")):
        if not os.path.isdir(os.path.join(root, sub)):
            raise DatasetError(f"voc2007: {root}/{sub} does not exist; expected {VOC_LAYOUT}")
    srcs = {s: VOCImages(root, s) for s in ("train", "val", "test")}
    splits = {s: [(s, np.arange(len(ds)))] for s, ds in srcs.items()}
    protocol = "official train/val/test (difficult objects left out of the AP)"
    return _make("voc2007", root, srcs, len(VOC_CLASSES), splits, protocol, VOC_CLASSES)
