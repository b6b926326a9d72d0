"""Image datasets shared by pretraining and the evaluations: image folders and Fashion-MNIST, and
for pretraining alone, every image file under a folder (no labels).

Each is a torch ``Dataset`` of ``(image, label)`` pairs and a pretraining *source*: ``load(i)``
and ``load_rgb(i)`` decode image ``i``, ``label(i)`` and ``describe(i)`` need no decoding.
Unreadable files raise :class:`BadImageError` (:func:`open_image` is the one check of a file:
empty, not an image, or over ``PIL.Image.MAX_IMAGE_PIXELS`` pixels; :func:`load_image` adds the
decode); pretraining skips and counts them, so one bad JPEG never stops a 200-epoch run, and the
evaluations' loaders (:func:`readable_loader`) skip them with one warning each. The decoders and
readers here serve both sides.
"""

from __future__ import annotations

import functools
import gzip
import io
import logging
import os
import struct
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import numpy as np
import torch
from fvcore.common.config import CfgNode
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision.datasets import DatasetFolder, FashionMNIST
from torchvision.datasets.folder import IMG_EXTENSIONS

from pretrain.config.defaults import (
    DATASET_TYPES,
    FASHION_MNIST,
    IMAGEFILES,
    IMAGEFOLDER,
    LABELLED_DATASET_TYPES,
)
from pretrain.utils.errors import DatasetError  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

__all__ = [
    "DATASET_TYPES",
    "FASHION_MNIST",
    "FASHION_MNIST_CLASSES",
    "IMAGEFILES",
    "IMAGEFOLDER",
    "BadImageError",
    "DatasetError",
    "FashionMNISTSource",
    "ImageFilesSource",
    "ImageFolderSource",
    "NoClassFoldersError",
    "TransformedDataset",
    "build_source",
    "dataset_type",
    "decodes",
    "left_out_line",
    "skipped_note",
    "load_image",
    "open_image",
    "readable_loader",
    "load_rgb",
    "read_class_list",
    "read_idx",
    "rgb_tensor",
    "to_rgb",
]

# The evaluation tools' --dataset and the linear probe's DATA.NAME spell it "fashion-mnist".
_ALIASES = {"fashion-mnist": FASHION_MNIST}


def dataset_type(name: str) -> str:
    """The code's spelling (:data:`LABELLED_DATASET_TYPES`) of a user-given labelled dataset's
    type (the evaluations need labels: ``imagefiles`` is pretraining's alone)."""
    kind = _ALIASES.get(name, name)
    if kind not in LABELLED_DATASET_TYPES:
        raise DatasetError(f"dataset {name!r}: expected one of {', '.join(LABELLED_DATASET_TYPES)}")
    return kind


class BadImageError(OSError):
    """One file that cannot be decoded as an image."""


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB; ``img.convert("RGB")`` alone would clip 16- and 32-bit images
    to white and warn on palette images with transparency."""
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


def open_image(path: str, data: bytes | None = None) -> Image.Image:
    """``path`` opened by PIL (its header read, nothing decoded; ``data``: the file's bytes when
    already read), or :class:`BadImageError` for a zero-byte file, a file that is no image, and
    an image of more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels (PIL's own limit, 89.5 MP by
    default; ``None`` lifts it). The one check of an image file, before any decode, for both sides.

    An image over the limit is refused rather than decoded reduced (``draft``/``reduce``): a
    reduced decode exists for JPEG only, a 200 MP PNG still costs 600 MB and seconds per worker
    for a 224 px crop, and PIL would raise ``DecompressionBombError`` (not an ``OSError``) above
    twice the limit anyway. The limit is PIL's, so that it is set in one place.
    """
    limit = Image.MAX_IMAGE_PIXELS
    try:
        if (len(data) if data is not None else os.path.getsize(path)) == 0:
            raise BadImageError(f"{path}: zero-byte file")
        with warnings.catch_warnings():
            # the limit is enforced below, the same for every size over it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path if data is None else io.BytesIO(data))
    except BadImageError:
        raise
    except Image.DecompressionBombError:
        raise BadImageError(
            f"{path}: more than {limit:,} pixels (PIL.Image.MAX_IMAGE_PIXELS), not decoded"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadImageError(f"{path}: {type(e).__name__}: {e}") from None
    width, height = img.size
    if limit is not None and width * height > limit:
        img.close()
        raise BadImageError(
            f"{path}: {width}x{height} = {width * height:,} pixels, more than {limit:,} "
            "(PIL.Image.MAX_IMAGE_PIXELS), not decoded"
        )
    return img


def load_image(path: str) -> Image.Image:
    """Decode ``path`` fully into an RGB image or raise :class:`BadImageError`
    (:func:`open_image`'s checks, then the decode)."""
    try:
        with open_image(path) as img:
            img.load()  # forces a full decode: truncated files fail here, not later
            return to_rgb(img)
    except BadImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadImageError(f"{path}: {type(e).__name__}: {e}") from None
    except Image.DecompressionBombError as e:  # a frame of a multi-image file over the limit
        raise BadImageError(f"{path}: {e}") from None


class _Readable(Dataset):
    """``dataset``'s items, ``None`` for an unreadable image (one warning each)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> object:
        try:
            return self.dataset[index]
        except BadImageError as e:
            logger.warning(f"skipped unreadable image: {e}")
            return None


def _collate_readable(batch: list) -> object:
    kept = [item for item in batch if item is not None]
    return default_collate(kept) if kept else None


def readable_loader(dataset: Dataset, **kwargs: Any) -> DataLoader:
    """``DataLoader(dataset, **kwargs)`` for the evaluations (kNN, probes, fine-tuning, the
    12-dataset harness, the pretraining kNN monitor): an image that does not decode
    (:class:`BadImageError`) is left out of its batch with the warning ``skipped unreadable
    image: <path>: <why>``, as pretraining skips it; a batch of unreadable images only is
    ``None``, which the loops skip. Counting what a pass left out is the caller's
    (:func:`skipped_note`)."""
    return DataLoader(_Readable(dataset), collate_fn=_collate_readable, **kwargs)


def skipped_note(what: str, total: int, used: int) -> str | None:
    """The line that counts the unreadable images a pass over ``total`` left out (``None``
    when none was)."""
    if used >= total:
        return None
    return f"{what}: {total - used} of {total} images skipped as unreadable"


def left_out_line(root: str, others: Counter) -> str:
    """The one line that counts the files of ``root`` without an image suffix, left out."""
    return (
        f"{root}: {sum(others.values())} files without an image suffix left out ("
        + ", ".join(f"{n} {suffix}" for suffix, n in others.most_common(5))
        + ")"
    )


def rgb_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> uint8 (H, W, 3) tensor (one copy, out of PIL's 4-byte pixels)."""
    with warnings.catch_warnings():
        # The array aliases a read-only buffer; it is only ever read (by the crops' resize).
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(img))


# Encodings of the probe images that must decode alike through both libraries: chroma
# subsampling 4:2:0 (ImageNet's), 4:2:2 and 4:4:4, progressive, restart markers.
_PROBE_ENCODINGS = (
    {"quality": 90, "subsampling": "4:2:0"},
    {"quality": 75, "subsampling": "4:2:2", "restart_marker_blocks": 3},
    {"quality": 95, "subsampling": "4:4:4", "progressive": True},
    {"quality": 60, "subsampling": "4:2:0", "progressive": True, "optimize": True},
)


def _turbo_decode(data: bytes) -> torch.Tensor:
    """JPEG bytes -> uint8 (H, W, 3) by torchvision's libjpeg-turbo (raises RuntimeError)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders in favour of TorchCodec (a warning per
        # call here); torch.frombuffer warns that bytes are read-only (they are only read).
        warnings.simplefilter("ignore")
        chw = decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    # decode_jpeg writes (H, W, 3) rows and returns them permuted; contiguous() is then free
    return chw.permute(1, 2, 0).contiguous()


@functools.cache
def turbo_matches_pil() -> bool:
    """Whether torchvision's JPEG decoder gives PIL's pixels on this build (once per process):
    both wrap libjpeg-turbo and agree bit for bit, unless a build has another libjpeg."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:29, 0:37]  # odd sizes: partial MCUs on both edges
    base = np.stack([xx * 7, yy * 9, (xx + yy) * 4], axis=-1) + rng.integers(0, 40, (29, 37, 3))
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    try:
        for kwargs in _PROBE_ENCODINGS:
            buf = io.BytesIO()
            img.save(buf, "JPEG", **kwargs)
            data = buf.getvalue()
            with Image.open(io.BytesIO(data)) as ref:
                ref.load()
                if not torch.equal(_turbo_decode(data), rgb_tensor(ref)):
                    raise ValueError("pixels differ")
    except (ImportError, RuntimeError, ValueError, OSError) as e:
        logger.info(f"JPEGs decode with PIL only: torchvision's decoder is unusable ({e})")
        return False
    return True


def load_rgb(path: str) -> torch.Tensor:
    """Decode ``path`` into a uint8 (H, W, 3) RGB tensor: ``load_image(path)``'s pixels and
    errors, bit for bit. Plain RGB JPEGs go through torchvision's libjpeg-turbo where
    :func:`turbo_matches_pil` (1.0 ms for a 500x375 photo instead of 1.6,
    ``benchmarks/bench_loader.py``); everything else through :func:`load_image`.
    """
    if turbo_matches_pil():
        try:
            with open(path, "rb") as f:
                data = f.read()
            with open_image(path, data) as img:  # reads the header only
                plain = img.format == "JPEG" and img.mode == "RGB"
            if plain:
                return _turbo_decode(data)
        except Exception:  # load_image below decodes it, or raises its BadImageError
            pass
    return rgb_tensor(load_image(path))


def decodes(path: str) -> bool:
    """Whether :func:`load_image` can decode ``path``."""
    try:
        load_image(path)
    except BadImageError:
        return False
    return True


def read_class_list(spec: str) -> list[str]:
    """Class (folder) names of a file, one per line (``#`` comments), or of the shipped
    ``imagenet100`` list; a class listed twice is a typo, hence an error."""
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


class NoClassFoldersError(DatasetError):
    """An image-folder root without class folders (pretraining then suggests ``imagefiles``)."""


class ImageFolderSource(DatasetFolder):
    """``root/<class>/.../<file>`` images through torchvision's ``DatasetFolder``, hidden ones
    skipped. ``extensions=None`` (pretraining) keeps other files, so that a non-image file is
    reported rather than silently ignored. ``class_list`` restricts the classes, indexed in
    sorted order, so one list gives train and val folders the same indices.
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

        others: Counter = Counter()

        def is_valid_file(path: str) -> bool:
            name = os.path.basename(path)
            if not _visible(name):
                return False
            if extensions is None or name.lower().endswith(extensions):
                return True
            others[os.path.splitext(name)[1].lower() or name] += 1
            return False

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
        if others:  # Thumbs.db, notes, sidecars: one line, as ImageFilesSource's
            logger.warning(left_out_line(root, others))
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
            raise NoClassFoldersError(
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

    def load_rgb(self, index: int) -> torch.Tensor:
        """Image ``index`` as a uint8 (H, W, 3) tensor: :meth:`load`'s pixels (:func:`load_rgb`)."""
        return load_rgb(self.samples[index][0])


def _image_files(root: str, extensions: tuple[str, ...]) -> tuple[list[str], Counter]:
    """The visible files under ``root`` whose names end in ``extensions`` (any case), sorted by
    path, and the count of the others by suffix. Follows links to folders as ``DatasetFolder``
    does, each real folder once (a link back up the tree does not loop).
    """
    found: list[str] = []
    others: Counter = Counter()
    seen: set[str] = set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(d for d in subfolders if _visible(d))
        for name in sorted(filter(_visible, names)):
            if name.lower().endswith(extensions):
                found.append(os.path.join(folder, name))
            else:
                others[os.path.splitext(name)[1].lower() or name] += 1
    found.sort(key=lambda path: os.path.relpath(path, root).split(os.sep))
    return found, others


class ImageFilesSource(Dataset):
    """Every visible image file under ``root``, at any depth, labelled -1 (``DATASETS.TYPE
    imagefiles``: pretraining on one's own photos). Other files are counted in one log line.
    Sorted by path, so the data order depends only on (SEED, iteration), not on the file system.
    """

    classes: list[str] = []

    def __init__(
        self,
        root: str,
        max_images: int = 0,
        *,
        transform: Callable | None = None,
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
    ) -> None:
        if not root or not os.path.isdir(root):
            raise DatasetError(f"{root!r}: folder of images does not exist")
        paths, others = _image_files(root, extensions)
        if others:
            logger.warning(left_out_line(root, others))
        if not paths:
            raise DatasetError(
                f"{root!r}: no image files in it or its subfolders (suffixes "
                f"{' '.join(extensions)})"
            )
        self.root, self.transform = root, transform
        self.samples = paths[:max_images] if max_images else paths

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[object, int]:
        img = self.load(index)
        return (img if self.transform is None else self.transform(img)), self.label(index)

    def describe(self, index: int) -> str:
        return self.samples[index]

    def label(self, index: int) -> int:
        return -1

    def load(self, index: int) -> Image.Image:
        return load_image(self.samples[index])

    def load_rgb(self, index: int) -> torch.Tensor:
        """Image ``index`` as a uint8 (H, W, 3) tensor: :meth:`load`'s pixels (:func:`load_rgb`)."""
        return load_rgb(self.samples[index])


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (``*.gz`` or not) of the MNIST family into an array; every problem
    raises :class:`DatasetError` naming the file."""
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


FASHION_MNIST_CLASSES = tuple(FashionMNIST.classes)


def _find_idx(root: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise DatasetError(
        f"{root}: missing Fashion-MNIST file {stem}.gz (install Debian's dataset-fashion-mnist "
        "or point the dataset root at a folder with its IDX files)"
    )


class FashionMNISTSource(Dataset):
    """Fashion-MNIST from its IDX files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``,
    e.g. Debian's ``dataset-fashion-mnist``), grey replicated to RGB; ``image_size`` (0: keep
    28) resizes bilinearly first, for the evaluations.
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

    def load_rgb(self, index: int) -> torch.Tensor:
        """Image ``index`` as a uint8 (H, W, 3) tensor: :meth:`load`'s pixels, without PIL."""
        if self.image_size and self.images.shape[1:] != (self.image_size,) * 2:
            return rgb_tensor(self.load(index))
        grey = torch.from_numpy(self.images[index])  # (28, 28)
        return grey.unsqueeze(-1).expand(-1, -1, 3).contiguous()

    def tensor(self) -> torch.Tensor:
        """All images as uint8 (N, 3, 28, 28)."""
        return torch.from_numpy(self.images).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


class TransformedDataset(Dataset):
    """``base``'s ``(image, label)`` pairs with ``transform`` applied, optionally restricted to
    ``indices``: one dataset serves several transforms without touching torchvision's classes.
    """

    def __init__(
        self, base: Dataset, transform: Callable, indices: Sequence[int] | None = None
    ) -> None:
        self.base = base
        self.transform = transform
        self.indices = None if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.base) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        img, label = self.base[index if self.indices is None else self.indices[index]]
        # a class id, or a multi-label vector (VOC2007's (20,) labels) kept as a tensor
        return self.transform(img), torch.as_tensor(label) if np.ndim(label) else int(label)


def build_source(cfg: CfgNode, split: str = "train") -> Dataset:
    """The pretraining source named by ``cfg.DATASETS``."""
    d = cfg.DATASETS
    if d.TYPE == FASHION_MNIST:
        return FashionMNISTSource(d.ROOT, split, d.MAX_IMAGES)
    if d.TYPE == IMAGEFILES:
        return ImageFilesSource(d.ROOT, d.MAX_IMAGES)
    try:
        return ImageFolderSource(d.ROOT, d.CLASS_LIST, d.MAX_IMAGES)
    except NoClassFoldersError as e:
        raise DatasetError(
            f"{e}; to pretrain on every image file under it (any folders, no labels), set "
            f"DATASETS.TYPE {IMAGEFILES}"
        ) from None
