"""Image datasets for the classification evaluations (ImageNet-style folders, Fashion-MNIST).

* :class:`FashionMNIST`: the idx files of Fashion-MNIST, read by pretraining's ``read_idx`` (for
  example the Debian package ``dataset-fashion-mnist`` at ``/usr/share/datasets/fashion-mnist``),
  grey replicated to RGB and upsampled to a configurable size so a ResNet can read them.
* :class:`ClassListImageFolder`: torchvision ``ImageFolder`` restricted to the classes of a list
  file (ImageNet-100 is ImageNet-1K restricted to 100 WordNet ids).
* :func:`read_subset_file` / :func:`subset_indices`: the SimCLR 1% / 10% label split files (one
  ImageNet training file name per line, e.g. ``n01440764_10026.JPEG``).

Every problem with the files on disk raises :class:`DatasetError` (pretraining's, one class for
both sides) naming the path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder

from pretrain.data.datasets import DatasetError, read_idx

__all__ = [
    "ClassListImageFolder",
    "DatasetError",
    "FashionMNIST",
    "FileListDataset",
    "TransformedDataset",
    "build_image_folder",
    "read_class_list",
    "read_idx",
    "read_subset_file",
    "subset_indices",
]


FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class FashionMNIST(Dataset):
    """Fashion-MNIST from its idx files, as RGB PIL images of ``image_size`` pixels.

    ``root`` holds ``{train,t10k}-images-idx3-ubyte.gz`` and ``{train,t10k}-labels-idx1-ubyte.gz``
    (uncompressed files without ``.gz`` are read too). ``limit`` keeps the first N images.
    """

    classes = FASHION_MNIST_CLASSES

    def __init__(
        self,
        root: str,
        split: str = "train",
        image_size: int = 32,
        transform: Callable | None = None,
        limit: int | None = None,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"Fashion-MNIST split must be 'train' or 'test', got {split!r}")
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        if not os.path.isdir(root):
            raise DatasetError(f"{root}: Fashion-MNIST root is not a directory")
        prefix = "train" if split == "train" else "t10k"
        images = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DatasetError(
                f"{root}: {prefix} images {images.shape} and labels {labels.shape} do not match"
            )
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        self.images = images
        self.targets = labels.astype(np.int64)
        self.image_size = image_size
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[object, int]:
        img = Image.fromarray(self.images[index], mode="L")
        if img.size != (self.image_size, self.image_size):
            img = img.resize((self.image_size, self.image_size), Image.BILINEAR)
        img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])


def _find_idx(root: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise DatasetError(f"{root}: missing Fashion-MNIST file {stem}.gz")


def read_class_list(path: str) -> list[str]:
    """Class (folder) names, one per line; blank lines and ``#`` comments are skipped."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such class-list file")
    with open(path) as f:
        names = [line.split("#", 1)[0].strip() for line in f]
    names = [n for n in names if n]
    if not names:
        raise DatasetError(f"{path}: class-list file is empty")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DatasetError(f"{path}: duplicate classes {dup[:5]}")
    return names


class ClassListImageFolder(ImageFolder):
    """``ImageFolder`` whose classes are those of ``class_list`` (all folders when ``None``).

    Class indices follow the sorted class names, as ``ImageFolder`` does, so the same list gives
    the same indices for the train and val folders.
    """

    def __init__(
        self,
        root: str,
        class_list: Sequence[str] | None = None,
        transform: Callable | None = None,
    ) -> None:
        self._class_list = None if class_list is None else list(class_list)
        super().__init__(root, transform=transform)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        classes, _ = super().find_classes(directory)
        if self._class_list is None:
            return classes, {c: i for i, c in enumerate(classes)}
        missing = sorted(set(self._class_list) - set(classes))
        if missing:
            raise DatasetError(
                f"{directory}: {len(missing)} classes of the class list have no folder, "
                f"e.g. {missing[:5]}"
            )
        chosen = sorted(self._class_list)
        return chosen, {c: i for i, c in enumerate(chosen)}


def build_image_folder(
    root: str, class_list_file: str = "", transform: Callable | None = None
) -> ClassListImageFolder:
    """An ImageFolder at ``root`` (``<root>/<class>/<image>``), optionally class-restricted."""
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: image folder does not exist (expected <root>/<class>/<img>)")
    classes = read_class_list(class_list_file) if class_list_file else None
    try:
        return ClassListImageFolder(root, classes, transform)
    except FileNotFoundError as e:
        raise DatasetError(f"{root}: not an image folder ({e})") from None


def read_subset_file(path: str) -> list[str]:
    """File names of a SimCLR label-subset file (``1percent.txt`` / ``10percent.txt``)."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such label-split file")
    with open(path) as f:
        names = [line.strip() for line in f if line.strip()]
    if not names:
        raise DatasetError(f"{path}: label-split file is empty")
    bad = [n for n in names if "/" in n or os.sep in n or " " in n]
    if bad:
        raise DatasetError(
            f"{path}: expected one image file name per line (e.g. n01440764_10026.JPEG), "
            f"got {bad[0]!r}"
        )
    return names


def subset_indices(dataset: ImageFolder, names: Sequence[str], source: str = "") -> list[int]:
    """Indices in ``dataset.samples`` of the images named in ``names`` (matched by basename)."""
    by_name: dict[str, int] = {}
    for i, (p, _) in enumerate(dataset.samples):
        by_name.setdefault(os.path.basename(p), i)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DatasetError(
            f"{source or 'label split'}: {len(missing)} of {len(names)} listed images are not in "
            f"{dataset.root}, e.g. {missing[:3]}"
        )
    return sorted({by_name[n] for n in names})


class FileListDataset(Dataset):
    """Images from ``(path, label)`` pairs, returned as RGB PIL images."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable | None = None):
        self.samples = list(samples)
        self.targets = [label for _, label in self.samples]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[object, int]:
        path, label = self.samples[index]
        with Image.open(path) as img:
            out = img.convert("RGB")
        if self.transform is not None:
            out = self.transform(out)
        return out, label


class TransformedDataset(Dataset):
    """A view of ``base`` (yielding ``(image, label)``) with ``transform`` applied to images.

    Lets one dataset object serve several transforms (feature extraction, training, eval)
    without touching the attributes of torchvision's classes.
    """

    def __init__(self, base: Dataset, transform: Callable, indices: Sequence[int] | None = None):
        self.base = base
        self.transform = transform
        self.indices = None if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.base) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, label = self.base[index if self.indices is None else self.indices[index]]
        return self.transform(img), int(label)
