"""Image sources for pretraining: ImageFolder roots (optionally class-filtered) and Fashion-MNIST.

A *source* maps an index to an RGB PIL image. Unreadable files (corrupt, truncated, zero-byte,
not an image) raise :class:`BadImageError`; :class:`PretrainDataset` skips them with one warning
per file and counts them, so one bad JPEG never stops a 200-epoch run.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
from importlib import resources

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from pretrain.errors import DatasetError  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

__all__ = [
    "BadImageError",
    "DatasetError",
    "FashionMNISTSource",
    "ImageFolderSource",
    "read_class_list",
    "read_idx",
    "to_rgb",
]


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


def read_class_list(spec: str) -> list[str]:
    """Class names from a file (one per line) or the shipped ``imagenet100`` list."""
    if spec == "imagenet100":
        text = resources.files("pretrain.data").joinpath("imagenet100.txt").read_text()
    else:
        if not os.path.isfile(spec):
            raise DatasetError(f"DATASETS.CLASS_LIST: class-list file {spec!r} not found")
        with open(spec) as f:
            text = f.read()
    names = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not names:
        raise DatasetError(f"DATASETS.CLASS_LIST: {spec!r} lists no classes")
    return names


class ImageFolderSource:
    """``root/<class>/<file>`` images; every regular non-hidden file is a candidate sample.

    Files are not filtered by extension on purpose: a non-image file in a class folder is
    reported (and skipped) rather than silently ignored.
    """

    def __init__(self, root: str, class_list: str = "", max_images: int = 0):
        if not root or not os.path.isdir(root):
            raise DatasetError(f"DATASETS.ROOT: dataset root {root!r} does not exist")
        classes = sorted(
            e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
        )
        if class_list:
            wanted = read_class_list(class_list)
            missing = sorted(set(wanted) - set(classes))
            if missing:
                raise DatasetError(
                    f"DATASETS.ROOT: {root!r} lacks {len(missing)} classes of "
                    f"{class_list!r}, e.g. {missing[:5]}"
                )
            classes = sorted(wanted)
        self.classes = classes
        self.samples: list[tuple[str, int]] = []
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            for dirpath, _, files in sorted(os.walk(folder, followlinks=True)):
                for fname in sorted(files):
                    if not fname.startswith("."):
                        self.samples.append((os.path.join(dirpath, fname), label))
        if max_images:
            self.samples = self.samples[:max_images]
        if not self.samples:
            raise DatasetError(
                f"DATASETS.ROOT: dataset root {root!r} is empty (expected <root>/<class>/<image>)"
            )
        self.root = root

    def __len__(self) -> int:
        return len(self.samples)

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


class FashionMNISTSource:
    """Fashion-MNIST from the IDX files of Debian's ``dataset-fashion-mnist`` (or any copy).

    The 28x28 grey images are replicated to RGB; the crop pipeline then upsamples them to the
    configured view sizes.
    """

    PREFIX = {"train": "train", "test": "t10k"}

    def __init__(self, root: str, split: str = "train", max_images: int = 0):
        if split not in self.PREFIX:
            raise DatasetError(f"Fashion-MNIST split must be train or test, got {split!r}")
        stem = os.path.join(root, self.PREFIX[split])
        paths = [f"{stem}-images-idx3-ubyte", f"{stem}-labels-idx1-ubyte"]
        found = []
        for p in paths:
            cand = [c for c in (p, p + ".gz") if os.path.isfile(c)]
            if not cand:
                raise DatasetError(
                    f"DATASETS.ROOT: {p}[.gz] not found (install Debian's dataset-fashion-mnist "
                    "or point DATASETS.ROOT at a folder with the IDX files)"
                )
            found.append(cand[0])
        self.images = read_idx(found[0])
        self.labels = read_idx(found[1]).astype(np.int64)
        if max_images:
            self.images, self.labels = self.images[:max_images], self.labels[:max_images]
        self.classes = [str(i) for i in range(10)]
        self.root = root

    def __len__(self) -> int:
        return len(self.images)

    def describe(self, index: int) -> str:
        return f"{self.root}[{index}]"

    def label(self, index: int) -> int:
        return int(self.labels[index])

    def load(self, index: int) -> Image.Image:
        return Image.fromarray(self.images[index], mode="L").convert("RGB")

    def tensor(self) -> torch.Tensor:
        """All images as uint8 (N, 3, 28, 28)."""
        return torch.from_numpy(self.images).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


def build_source(cfg, split: str = "train"):
    """The source named by ``cfg.DATASETS``."""
    d = cfg.DATASETS
    if d.TYPE == "fashion_mnist":
        return FashionMNISTSource(d.ROOT, split, d.MAX_IMAGES)
    return ImageFolderSource(d.ROOT, d.CLASS_LIST, d.MAX_IMAGES)
