"""The classification evaluations' conventions on top of :mod:`pretrain.data.datasets`: image
folders of image files only (optionally a class list: ImageNet-100), labelled train / test sets,
and SimCLR's 1% / 10% label-split files. A problem on disk raises :class:`DatasetError` naming
the path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from torchvision.datasets.folder import IMG_EXTENSIONS

from pretrain.data.datasets import FashionMNISTSource, ImageFolderSource
from pretrain.data.splits import labelled_splits
from pretrain.utils.errors import DatasetError

__all__ = ["build_image_folder", "labelled_sets", "read_subset_file", "subset_indices"]


def build_image_folder(
    root: str, class_list_file: str = "", transform: Callable | None = None
) -> ImageFolderSource:
    """The image files of ``<root>/<class>/``, optionally only the classes of a list file."""
    return ImageFolderSource(
        root, class_list_file, transform=transform, extensions=IMG_EXTENSIONS, allow_empty=False
    )


def labelled_sets(
    kind: str, root: str, class_list: str = "", *, limit: int = 0, image_size: int = 0
) -> (
    tuple[FashionMNISTSource, FashionMNISTSource, int]
    | tuple[ImageFolderSource, ImageFolderSource, int]
):
    """``(train, test, num_classes)`` yielding PIL images with a ``targets`` list: Fashion-MNIST's
    train and test splits (the first ``limit`` of each, upsampled to ``image_size``) or the image
    folders ``<root>/train`` and ``<root>/val`` as :func:`build_image_folder` reads them
    (optionally restricted to ``class_list``), which must hold the same classes."""
    train, test = labelled_splits(
        kind,
        root,
        class_list,
        limits=(limit, limit),
        image_size=image_size,
        extensions=IMG_EXTENSIONS,
        allow_empty=False,
    )
    if train.classes != test.classes:
        diff = sorted(set(train.classes) ^ set(test.classes))
        raise DatasetError(f"{root}: train/ and val/ have different classes, e.g. {diff[:5]}")
    return train, test, len(train.classes)


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


def subset_indices(dataset: ImageFolderSource, names: Sequence[str], source: str = "") -> list[int]:
    """Indices in ``dataset.samples`` of the images named in ``names`` (matched by basename); a
    name several images share (``0001.png`` in every class) is an error."""
    by_name: dict[str, list[int]] = {}
    for i, (p, _) in enumerate(dataset.samples):
        by_name.setdefault(os.path.basename(p), []).append(i)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DatasetError(
            f"{source or 'label split'}: {len(missing)} of {len(names)} listed images are not in "
            f"{dataset.root}, e.g. {missing[:3]}"
        )
    shared = sorted({n for n in names if len(by_name[n]) > 1})
    if shared:
        where = [os.path.relpath(dataset.samples[i][0], dataset.root) for i in by_name[shared[0]]]
        raise DatasetError(
            f"{source or 'label split'}: {len(shared)} listed file names are shared by several "
            f"images of {dataset.root}, e.g. {shared[0]!r} is {', '.join(where[:3])}"
            + (f" and {len(where) - 3} more" if len(where) > 3 else "")
            + "; a split file names images by file name, which must be unique across classes"
        )
    return sorted({by_name[n][0] for n in names})
