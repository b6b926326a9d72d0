"""Image datasets shared by pretraining and the evaluations: image folders and Fashion-MNIST.

Each is a torch ``Dataset`` of ``(image, label)`` pairs (RGB PIL images, ``transform`` applied
when given) and also a *source* for pretraining: ``load(i)`` decodes image ``i`` to RGB,
``label(i)`` and ``describe(i)`` need no decoding. Unreadable files (corrupt, truncated,
zero-byte, not an image) raise :class:`BadImageError`; pretraining's ``PretrainDataset`` skips
them with one warning per file and counts them, so one bad JPEG never stops a 200-epoch run.

Here too, once for both sides: the RGB conversion :func:`to_rgb`, the decoder
:func:`load_image` (and :func:`decodes`), the class-list reader :func:`read_class_list`, the
IDX reader :func:`read_idx` and the dataset-type names (:func:`dataset_type`).
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
from collections.abc import Callable, Sequence
from importlib import resources

import numpy as np
import torch
from fvcore.common.config import CfgNode
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset
from torchvision.datasets import DatasetFolder

from pretrain.utils.errors import DatasetError  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

__all__ = [
    "DATASET_TYPES",
    "FASHION_MNIST",
    "FASHION_MNIST_CLASSES",
    "IMAGEFOLDER",
    "BadImageError",
    "DatasetError",
    "FashionMNISTSource",
    "ImageFolderSource",
    "TransformedDataset",
    "build_source",
    "dataset_type",
    "decodes",
    "load_image",
    "read_class_list",
    "read_idx",
    "to_rgb",
]

FASHION_MNIST = "fashion_mnist"
IMAGEFOLDER = "imagefolder"
DATASET_TYPES = (IMAGEFOLDER, FASHION_MNIST)
# The evaluation tools' --dataset and the linear probe's DATA.NAME spell it "fashion-mnist";
# existing commands and configs keep working through this one mapping.
_ALIASES = {"fashion-mnist": FASHION_MNIST}


def dataset_type(name: str) -> str:
    """The code's spelling (:data:`DATASET_TYPES`) of a user-given dataset type."""
    kind = _ALIASES.get(name, name)
    if kind not in DATASET_TYPES:
        raise DatasetError(f"dataset {name!r}: expected one of {', '.join(DATASET_TYPES)}")
    return kind


class BadImageError(OSError):
    """One file that cannot be decoded as an image."""


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode (L, P, RGBA, CMYK, I;16, I, F, ...) to 8-bit RGB.

    Why not plain ``img.convert("RGB")``: it clips 16-bit and 32-bit images to 255 (they come
    out white) and warns on palette images with transparency.
    """
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        hi = 65535.0 if img.mode.startswith("I;16") else max(float(arr.max()), 1.0)
        lo = 0.0 if img.mode.startswith("I;16") else min(float(arr.min()), 0.0)
        arr = np.clip((arr - lo) / (hi - lo) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(arr, mode="L").convert("RGB")
    if img.mode == "P":
        img = img.convert("RGBA")
    return img.convert("RGB")


def load_image(path: str) -> Image.Image:
    """Decode ``path`` fully into an RGB image or raise :class:`BadImageError`."""
    try:
        if os.path.getsize(path) == 0:
            raise BadImageError(f"{path}: zero-byte file")
        with Image.open(path) as img:
            img.load()  # forces a full decode: truncated files fail here, not later
            return to_rgb(img)
    except BadImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadImageError(f"{path}: {type(e).__name__}: {e}") from None


def decodes(path: str) -> bool:
    """Whether :func:`load_image` can decode ``path``."""
    try:
        load_image(path)
    except BadImageError:
        return False
    return True


def read_class_list(spec: str) -> list[str]:
    """Class (folder) names of a file, one per line, or of the shipped ``imagenet100`` list.

    Blank lines and ``#`` comments are skipped; a class listed twice is an error (a list with a
    duplicate is a typo, and would silently have one class fewer than it says).
    """
    if spec == "imagenet100":
        text = resources.files("pretrain.data").joinpath("imagenet100.txt").read_text()
    else:
        if not os.path.isfile(spec):
            raise DatasetError(f"{spec}: no such class-list file")
        with open(spec) as f:
            text = f.read()
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [n for n in names if n]
    if not names:
        raise DatasetError(f"{spec}: class-list file lists no classes")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DatasetError(f"{spec}: class {name!r} is listed twice")
        seen.add(name)
    return names


def _visible(name: str) -> bool:
    return not name.startswith(".")


class ImageFolderSource(DatasetFolder):
    """``root/<class>/.../<file>`` images through torchvision's ``DatasetFolder``.

    Hidden folders and files are skipped. ``extensions=None`` (pretraining) keeps every other
    file on purpose: a non-image file in a class folder is reported (and skipped) rather than
    silently ignored; the evaluations pass torchvision's ``IMG_EXTENSIONS``. ``class_list``
    (see :func:`read_class_list`) restricts the classes, indexed in sorted order either way, so
    one list gives the same indices for train and val folders. ``allow_empty`` permits class
    folders without images; ``max_images`` keeps the first N images.
    """

    def __init__(
        self,
        root: str,
        class_list: str = "",
        max_images: int = 0,
        *,
        transform: Callable | None = None,
        extensions: tuple[str, ...] | None = None,
        allow_empty: bool = True,
    ) -> None:
        if not root or not os.path.isdir(root):
            raise DatasetError(
                f"{root!r}: image folder does not exist (expected <root>/<class>/<image>)"
            )
        self.class_list = class_list

        def is_valid_file(path: str) -> bool:
            name = os.path.basename(path)
            return _visible(name) and (extensions is None or name.lower().endswith(extensions))

        try:
            super().__init__(
                root,
                load_image,
                transform=transform,
                is_valid_file=is_valid_file,
                allow_empty=allow_empty,
            )
        except FileNotFoundError as e:  # torchvision: a class folder without a valid file
            raise DatasetError(f"{root!r}: not an image folder ({e})") from None
        if max_images:
            self.samples = self.samples[:max_images]
            self.targets = [label for _, label in self.samples]
        if not self.samples:
            raise DatasetError(
                f"{root!r}: not an image folder: no images (expected <root>/<class>/<image>)"
            )

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and _visible(e.name))
        if not classes:
            raise DatasetError(
                f"{directory!r}: not an image folder: no class folders "
                "(expected <root>/<class>/<image>)"
            )
        if self.class_list:
            wanted = read_class_list(self.class_list)
            missing = sorted(set(wanted) - set(classes))
            if missing:
                raise DatasetError(
                    f"{directory}: {len(missing)} classes of the class list have no folder, "
                    f"e.g. {missing[:5]} (class list {self.class_list})"
                )
            classes = sorted(wanted)
        return classes, {c: i for i, c in enumerate(classes)}

    def keep(self, flags: Sequence[bool]) -> None:
        """Keep only the images whose flag is true (e.g. those that :func:`decodes`)."""
        if len(flags) != len(self.samples):
            raise ValueError(f"{len(flags)} flags for {len(self.samples)} images")
        self.samples = [s for s, ok in zip(self.samples, flags, strict=True) if ok]
        self.targets = [label for _, label in self.samples]

    def describe(self, index: int) -> str:
        return self.samples[index][0]

    def label(self, index: int) -> int:
        return self.samples[index][1]

    def load(self, index: int) -> Image.Image:
        return load_image(self.samples[index][0])


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (``*.gz`` or uncompressed) of the MNIST family into an array.

    The format is two zero bytes, a type code, the number of dimensions, the dimensions as
    big-endian int32 and the data in C order. Every problem raises :class:`DatasetError` naming
    the file.
    """
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such idx file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"{path}: cannot read idx file ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path}: not an idx file (bad magic {raw[:4].hex()})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: idx header truncated")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path}: idx payload has {len(raw) - header} bytes, shape {shape} needs {expected}"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


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


def _find_idx(root: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise DatasetError(
        f"{root}: missing Fashion-MNIST file {stem}.gz (install Debian's dataset-fashion-mnist "
        "or point the dataset root at a folder with its IDX files)"
    )


class FashionMNISTSource(Dataset):
    """Fashion-MNIST from its IDX files (e.g. Debian's ``dataset-fashion-mnist``).

    ``root`` holds ``{train,t10k}-images-idx3-ubyte.gz`` and ``{train,t10k}-labels-idx1-ubyte.gz``
    (uncompressed files without ``.gz`` are read too). The 28x28 grey images are replicated to
    RGB; ``image_size`` (0: keep 28) resizes them first (bilinear) for the evaluations, the
    pretraining crops upsample them themselves. ``max_images`` keeps the first N images.
    """

    PREFIX = {"train": "train", "test": "t10k"}
    classes = list(FASHION_MNIST_CLASSES)

    def __init__(
        self,
        root: str,
        split: str = "train",
        max_images: int = 0,
        *,
        image_size: int = 0,
        transform: Callable | None = None,
    ) -> None:
        if split not in self.PREFIX:
            raise DatasetError(f"Fashion-MNIST split must be train or test, got {split!r}")
        if image_size < 0:
            raise DatasetError(f"Fashion-MNIST image_size >= 0 (0: 28 px) needed, got {image_size}")
        if not os.path.isdir(root):
            raise DatasetError(f"{root}: Fashion-MNIST root is not a directory")
        prefix = self.PREFIX[split]
        images = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DatasetError(
                f"{root}: {prefix} images {images.shape} and labels {labels.shape} do not match"
            )
        if max_images:
            images, labels = images[:max_images], labels[:max_images]
        self.images = images
        self.targets = labels.astype(np.int64)
        self.image_size = image_size
        self.transform = transform
        self.root = root

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[object, int]:
        img = self.load(index)
        return (img if self.transform is None else self.transform(img)), self.label(index)

    def describe(self, index: int) -> str:
        return f"{self.root}[{index}]"

    def label(self, index: int) -> int:
        return int(self.targets[index])

    def load(self, index: int) -> Image.Image:
        img = Image.fromarray(self.images[index])  # uint8 (28, 28): mode L
        size = self.image_size
        if size and img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return to_rgb(img)

    def tensor(self) -> torch.Tensor:
        """All images as uint8 (N, 3, 28, 28)."""
        return torch.from_numpy(self.images).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


class TransformedDataset(Dataset):
    """A view of ``base`` (yielding ``(image, label)``) with ``transform`` applied to images,
    optionally restricted to ``indices``.

    Lets one dataset object serve several transforms and subsets (feature extraction, training,
    evaluation) without touching the attributes of torchvision's classes.
    """

    def __init__(
        self, base: Dataset, transform: Callable, indices: Sequence[int] | None = None
    ) -> None:
        self.base = base
        self.transform = transform
        self.indices = None if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.base) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, label = self.base[index if self.indices is None else self.indices[index]]
        return self.transform(img), int(label)


def build_source(cfg: CfgNode, split: str = "train") -> Dataset:
    """The pretraining source named by ``cfg.DATASETS``."""
    d = cfg.DATASETS
    if d.TYPE == FASHION_MNIST:
        return FashionMNISTSource(d.ROOT, split, d.MAX_IMAGES)
    return ImageFolderSource(d.ROOT, d.CLASS_LIST, d.MAX_IMAGES)
