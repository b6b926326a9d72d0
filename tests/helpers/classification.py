"""Helpers shared by the classification tests (and a few others): tiny fake copies of the 12
transfer datasets in their real on-disk layouts, an ImageNet-style folder, Fashion-MNIST idx
files, and the ``single_thread`` / ``no_md5`` fixtures (a test module uses a fixture by importing
it by name).

The dataset generators write exactly the files torchvision's dataset classes (and the Birdsnap /
SUN397 partition readers of ``transfer_datasets``) open. torchvision verifies MD5 sums of the
CIFAR, Flowers-102 and Places365 metadata; the ``no_md5`` fixture replaces those checks by
existence checks, as torchvision's own dataset tests do.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import ROOT
from transfer.classification.transfer_datasets import DATASET_NAMES

scipy_io = pytest.importorskip("scipy.io")

REPO = str(ROOT)
QUICK = os.path.join(REPO, "configs", "eval", "quick_schedules")
IMAGENET_CLASSES = ["n01440764", "n01443537", "n01484850"]
CLASSES = ["alpha", "beta", "gamma"]


def _img(path: str, seed: int, mode: str = "RGB", size=(12, 10)) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(path)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def make_aircraft(root: str, per_split: int = 2) -> dict:
    base = os.path.join(root, "fgvc-aircraft-2013b", "data")
    names = ["707-320", "A300B4", "Cessna 172"]  # variant names may contain spaces
    _write(os.path.join(base, "variants.txt"), "\n".join(names) + "\n")
    n = 0
    for split in ("train", "val", "test"):
        lines = []
        for c, name in enumerate(names):
            for _ in range(per_split):
                img_id = f"{1000000 + n:07d}"
                _img(os.path.join(base, "images", f"{img_id}.jpg"), n + c)
                lines.append(f"{img_id} {name}")
                n += 1
        _write(os.path.join(base, f"images_variant_{split}.txt"), "\n".join(lines) + "\n")
    return {"images": n, "train": 3 * per_split, "val": 3 * per_split, "test": 3 * per_split}


def make_birdsnap(root: str, per_class: int = 12, broken: int = 1) -> dict:
    for c, name in enumerate(CLASSES):
        for i in range(per_class):
            _img(os.path.join(root, "images", name, f"{i:03d}.jpg"), 100 * c + i)
    for i in range(broken):
        _write(os.path.join(root, "images", CLASSES[0], f"broken{i}.jpg"), "not a jpeg")
    n = per_class * len(CLASSES)
    return {"images": n, "train": n - 30, "val": 15, "test": 15}


def make_caltech101(root: str, per_class: int = 31) -> dict:
    base = os.path.join(root, "caltech101", "101_ObjectCategories")
    _img(os.path.join(base, "BACKGROUND_Google", "image_0001.jpg"), 0)  # dropped by torchvision
    for c, name in enumerate(CLASSES):
        for i in range(1, per_class + 1):
            mode = "L" if i == 1 else "RGB"  # Caltech-101 has greyscale pictures
            _img(os.path.join(base, name, f"image_{i:04d}.jpg"), 100 * c + i, mode)
    n = per_class * len(CLASSES)
    return {"images": n, "train": 3 * 24, "val": 3 * 6, "test": n - 90}


def make_cars(root: str, train_per_class: int = 5, test_per_class: int = 2) -> dict:
    base = os.path.join(root, "stanford_cars")
    dtype = [(k, "O") for k in ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")]
    names = np.array([f"Car {c}" for c in CLASSES], dtype=object)
    os.makedirs(os.path.join(base, "devkit"))
    scipy_io.savemat(os.path.join(base, "devkit", "cars_meta.mat"), {"class_names": names})
    for split, per, mat in (
        ("train", train_per_class, os.path.join(base, "devkit", "cars_train_annos.mat")),
        ("test", test_per_class, os.path.join(base, "cars_test_annos_withlabels.mat")),
    ):
        ann = np.zeros(per * len(CLASSES), dtype=dtype)
        for i in range(len(ann)):
            fname = f"{i:05d}.jpg"
            _img(os.path.join(base, f"cars_{split}", fname), i + (0 if split == "train" else 500))
            ann[i] = (1, 1, 8, 8, np.uint8(i % len(CLASSES) + 1), fname)
        scipy_io.savemat(mat, {"annotations": ann})
    return {"images": 3 * (train_per_class + test_per_class), "train": 12, "val": 3, "test": 6}


def _cifar_batch(n_classes: int, per_class: int, seed: int, key: str) -> dict:
    rng = np.random.default_rng(seed)
    labels = [c for _ in range(per_class) for c in range(n_classes)]
    data = rng.integers(0, 255, (len(labels), 3072), dtype=np.uint8)
    return {"data": data, key: labels}


def _pickle(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def make_cifar10(root: str) -> dict:
    base = os.path.join(root, "cifar-10-batches-py")
    for i in range(1, 6):
        _pickle(os.path.join(base, f"data_batch_{i}"), _cifar_batch(10, 1, i, "labels"))
    _pickle(os.path.join(base, "test_batch"), _cifar_batch(10, 1, 9, "labels"))
    _pickle(os.path.join(base, "batches.meta"), {"label_names": [f"c{i}" for i in range(10)]})
    return {"images": 60, "train": 40, "val": 10, "test": 10}


def make_cifar100(root: str, n_classes: int = 10) -> dict:
    base = os.path.join(root, "cifar-100-python")
    _pickle(os.path.join(base, "train"), _cifar_batch(n_classes, 3, 1, "fine_labels"))
    _pickle(os.path.join(base, "test"), _cifar_batch(n_classes, 1, 2, "fine_labels"))
    _pickle(os.path.join(base, "meta"), {"fine_label_names": [f"c{i}" for i in range(n_classes)]})
    return {"images": 4 * n_classes, "train": 2 * n_classes, "val": n_classes, "test": n_classes}


def make_dtd(root: str, per_split: int = 2) -> dict:
    base = os.path.join(root, "dtd", "dtd")
    n = 0
    for split in ("train", "val", "test"):
        lines = []
        for c, name in enumerate(CLASSES):
            for i in range(per_split):
                fname = f"{name}_{split}_{i}.jpg"
                _img(os.path.join(base, "images", name, fname), n + c)
                lines.append(f"{name}/{fname}")
                n += 1
        _write(os.path.join(base, "labels", f"{split}1.txt"), "\n".join(lines) + "\n")
    return {"images": n, "train": 3 * per_split, "val": 3 * per_split, "test": 3 * per_split}


def make_flowers(root: str, per_split: int = 2) -> dict:
    base = os.path.join(root, "flowers-102")
    n_img = 3 * per_split * len(CLASSES)
    labels = np.array([i % len(CLASSES) + 1 for i in range(n_img)], dtype=np.uint8)
    for i in range(1, n_img + 1):
        _img(os.path.join(base, "jpg", f"image_{i:05d}.jpg"), i)
    ids = np.arange(1, n_img + 1).reshape(3, -1)
    scipy_io.savemat(os.path.join(base, "imagelabels.mat"), {"labels": labels})
    scipy_io.savemat(
        os.path.join(base, "setid.mat"), {"trnid": ids[0], "valid": ids[1], "tstid": ids[2]}
    )
    k = per_split * len(CLASSES)
    return {"images": n_img, "train": k, "val": k, "test": k}


def make_food(root: str, train_per_class: int = 5, test_per_class: int = 2) -> dict:
    base = os.path.join(root, "food-101")
    n = 0
    for split, per in (("train", train_per_class), ("test", test_per_class)):
        meta = {}
        for name in CLASSES:
            meta[name] = []
            for _ in range(per):
                _img(os.path.join(base, "images", name, f"{n}.jpg"), n)
                meta[name].append(f"{name}/{n}")
                n += 1
        _write(os.path.join(base, "meta", f"{split}.json"), json.dumps(meta))
    return {"images": n, "train": 12, "val": 3, "test": 6}


def make_pets(root: str, trainval_per_class: int = 5, test_per_class: int = 2) -> dict:
    base = os.path.join(root, "oxford-iiit-pet")
    breeds = ["Abyssinian", "basset_hound", "Bengal"]
    n = 0
    for split, per in (("trainval", trainval_per_class), ("test", test_per_class)):
        lines = []
        for c, breed in enumerate(breeds):
            for _ in range(per):
                n += 1
                _img(os.path.join(base, "images", f"{breed}_{n}.jpg"), n)
                lines.append(f"{breed}_{n} {c + 1} {1 if breed[0].isupper() else 2} {n}")
        _write(os.path.join(base, "annotations", f"{split}.txt"), "\n".join(lines) + "\n")
    return {"images": n, "train": 12, "val": 3, "test": 6}


def make_places365(root: str, train_per_class: int = 5, val_per_class: int = 2) -> dict:
    cats = ["/a/airfield", "/b/bakery/shop", "/c/canyon"]
    _write(
        os.path.join(root, "categories_places365.txt"),
        "".join(f"{c} {i}\n" for i, c in enumerate(cats)),
    )
    lines, n = [], 0
    for i, c in enumerate(cats):
        for _ in range(train_per_class):
            n += 1
            rel = f"{c}/{n:08d}.jpg"
            _img(os.path.join(root, "data_256_standard", rel.lstrip("/")), n)
            lines.append(f"{rel} {i}")
    _write(os.path.join(root, "places365_train_standard.txt"), "\n".join(lines) + "\n")
    lines = []
    for i in range(len(cats) * val_per_class):
        name = f"Places365_val_{i + 1:08d}.jpg"
        _img(os.path.join(root, "val_256", name), 1000 + i)
        lines.append(f"{name} {i % len(cats)}")
    _write(os.path.join(root, "places365_val.txt"), "\n".join(lines) + "\n")
    return {"images": n + len(lines), "train": 12, "val": 3, "test": 6}


def make_sun397(
    root: str, train_per_class: int = 5, test_per_class: int = 2, partitions_in: str = ""
) -> dict:
    """``partitions_in``: where Partitions.zip was unpacked, ``root`` (default) or ``SUN397``."""
    base = os.path.join(root, "SUN397")
    cats = ["/a/abbey", "/b/bakery/shop", "/c/canyon"]
    _write(os.path.join(base, "ClassName.txt"), "\n".join(cats) + "\n")
    parts: dict[str, list[str]] = {"Training_01": [], "Testing_01": []}
    n = 0
    for c in cats:
        for split, per in (("Training_01", train_per_class), ("Testing_01", test_per_class)):
            for _ in range(per):
                n += 1
                rel = f"{c}/sun_{n:06d}.jpg"
                _img(os.path.join(base, rel.lstrip("/")), n)
                parts[split].append(rel)
        _img(os.path.join(base, c.lstrip("/"), "sun_unused.jpg"), 999)  # in no partition
    for split, lines in parts.items():
        _write(
            os.path.join(root, partitions_in, "Partitions", f"{split}.txt"), "\n".join(lines) + "\n"
        )
    return {"images": n, "train": 12, "val": 3, "test": 6}


MAKERS = {
    "aircraft": make_aircraft,
    "birdsnap": make_birdsnap,
    "caltech101": make_caltech101,
    "cars": make_cars,
    "cifar10": make_cifar10,
    "cifar100": make_cifar100,
    "dtd": make_dtd,
    "flowers": make_flowers,
    "food": make_food,
    "pets": make_pets,
    "places365": make_places365,
    "sun397": make_sun397,
}


VOC_SPLITS = {"train": 30, "val": 30, "test": 20}


def voc_labels(index: int) -> dict[str, str]:
    """The planted objects of fake VOC image ``index``: classes ``index % 20`` and
    ``(index + 7) % 20`` present, ``(index + 3) % 20`` only difficult when ``index % 3 == 0``
    (class name -> "1" present or "0" difficult, the devkit's per-class file values)."""
    from transfer.classification.voc07 import VOC_CLASSES

    objects = {VOC_CLASSES[(index + 3) % 20]: "0"} if index % 3 == 0 else {}
    objects |= {VOC_CLASSES[index % 20]: "1", VOC_CLASSES[(index + 7) % 20]: "1"}
    return objects


def make_voc2007(root: str, splits: dict[str, int] | None = None, size=(16, 12)) -> dict:
    """A VOC2007 folder: ``Annotations/<id>.xml`` (objects with ``difficult`` flags),
    ``JPEGImages/<id>.jpg``, ``ImageSets/Main/{train,val,trainval,test}.txt`` and the per-class
    ``<class>_<split>.txt`` files (1 present, -1 absent, 0 only difficult), as the devkit ships."""
    from transfer.classification.voc07 import VOC_CLASSES

    splits = splits or VOC_SPLITS
    ids: dict[str, list[str]] = {}
    n = 0
    for split, count in splits.items():
        ids[split] = []
        for _ in range(count):
            img_id = f"{n * 2 + 5:06d}"  # VOC ids are zero-padded and not contiguous
            _img(os.path.join(root, "JPEGImages", f"{img_id}.jpg"), n, size=size)
            objects = "".join(
                f"<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>"
                f"<difficult>{1 - int(flag)}</difficult><bndbox><xmin>1</xmin><ymin>1</ymin>"
                f"<xmax>8</xmax><ymax>8</ymax></bndbox></object>"
                for name, flag in voc_labels(n).items()
            )
            _write(
                os.path.join(root, "Annotations", f"{img_id}.xml"),
                f"<annotation><folder>VOC2007</folder><filename>{img_id}.jpg</filename>"
                f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"
                f"{objects}</annotation>\n",
            )
            ids[split].append((img_id, n))
            n += 1
    ids["trainval"] = ids["train"] + ids["val"]
    main = os.path.join(root, "ImageSets", "Main")
    for split, entries in ids.items():
        _write(os.path.join(main, f"{split}.txt"), "".join(f"{i}\n" for i, _ in entries))
        for name in VOC_CLASSES:
            lines = []
            for img_id, index in entries:
                value = {"1": " 1", "0": " 0"}.get(voc_labels(index).get(name, ""), "-1")
                lines.append(f"{img_id} {value}\n")
            _write(os.path.join(main, f"{name}_{split}.txt"), "".join(lines))
    return {s: [i for i, _ in e] for s, e in ids.items()}


def make_all(root: str) -> dict[str, dict]:
    """All 12 fake datasets under ``root/<key>``; returns each one's expected sizes."""
    return {k: MAKERS[k](os.path.join(root, k)) for k in DATASET_NAMES}


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread while these tests run (tests/conftest.py asks for 2). On the shared
    2-core test machine two OpenMP threads competing with other jobs made the tiny ResNet
    passes about 10x slower (24 s instead of 2.4 s for the 12-dataset run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_md5(monkeypatch):
    """Existence instead of MD5 checks in the torchvision readers that verify checksums."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.flowers102 as flowers102
    import torchvision.datasets.places365 as places365

    def exists(path, md5=None):
        return os.path.isfile(path)

    for mod in (cifar, flowers102, places365):
        monkeypatch.setattr(mod, "check_integrity", exists)


def make_imagenet(root: str, train_per_class: int = 6, val_per_class: int = 2) -> str:
    """ImageNet-style ``train/<wnid>/<wnid>_<n>.JPEG`` and ``val/<wnid>/...``."""
    rng = np.random.default_rng(0)
    for split, per in (("train", train_per_class), ("val", val_per_class)):
        for c, wnid in enumerate(IMAGENET_CLASSES):
            os.makedirs(os.path.join(root, split, wnid))
            for i in range(per):
                img = rng.integers(0, 60, (20, 24, 3), dtype=np.uint8)
                img[..., c] += 150  # class-dependent colour
                Image.fromarray(img).save(os.path.join(root, split, wnid, f"{wnid}_{i}.JPEG"))
    return root


def write_idx(path: str, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(data)


def make_knn_fashion_mnist(root: str, n_train: int = 40, n_test: int = 20) -> str:
    """Idx files whose classes differ by a bright stripe position (kNN-separable)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 40, (n, 28, 28))
        for i, c in enumerate(labels):
            images[i, :, 2 * c : 2 * c + 6] = 250
        write_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return root
