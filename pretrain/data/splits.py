"""Splits of a dataset, for both sides of the project: its labelled train / test images
(:func:`labelled_splits`), evenly spaced subsets and seeded per-class splits."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence

import numpy as np

from pretrain.data.datasets import FASHION_MNIST, FashionMNISTSource, ImageFolderSource

__all__ = ["evenly_spaced", "labelled_splits", "per_class_split"]


def labelled_splits(
    kind: str,
    root: str,
    class_list: str = "",
    *,
    limits: tuple[int, int] = (0, 0),
    image_size: int = 0,
    transform: Callable | None = None,
    extensions: tuple[str, ...] | None = None,
    allow_empty: bool = True,
) -> tuple[FashionMNISTSource, FashionMNISTSource] | tuple[ImageFolderSource, ImageFolderSource]:
    """The labelled ``(train, test)`` images of a classification dataset of type ``kind``:
    Fashion-MNIST's splits in ``root`` (the first ``limits`` images of each, 0: all), or the
    image folders ``root/train`` and ``root/val`` (``class_list`` indexed alike in both)."""
    if kind == FASHION_MNIST:
        return (
            FashionMNISTSource(
                root, "train", limits[0], image_size=image_size, transform=transform
            ),
            FashionMNISTSource(root, "test", limits[1], image_size=image_size, transform=transform),
        )
    train, test = (
        ImageFolderSource(
            os.path.join(root, sub),
            class_list,
            transform=transform,
            extensions=extensions,
            allow_empty=allow_empty,
        )
        for sub in ("train", "val")
    )
    return train, test


def evenly_spaced(total: int, count: int) -> list[int]:
    """``count`` distinct indices spread over ``range(total)`` (all if count <= 0), so that a
    class-sorted image folder keeps every class."""
    if count <= 0 or count >= total:
        return list(range(total))
    return [int(i) for i in np.linspace(0, total - 1, count).round()]


def per_class_split(
    labels: Sequence[int] | np.ndarray,
    counts: Sequence[int] | Callable[[int], Sequence[int]],
    seed: int,
    exclude: Collection[int] = (),
) -> list[np.ndarray]:
    """Seeded per-class split: ``len(counts) + 1`` sorted index arrays into ``labels``. Each
    class's indices not in ``exclude`` are shuffled by one shared ``default_rng(seed)``; part
    ``j`` takes the next ``counts[j]`` (or ``counts(n_eligible)[j]``), the last part the rest.

    Not ``sklearn``'s ``StratifiedShuffleSplit``: it allocates over the whole set, refuses
    one-image classes and draws other indices, and documented results depend on these.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    excluded = set(exclude)
    parts: list[list[np.ndarray]] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if excluded:
            idx = np.asarray([i for i in idx if i not in excluded], dtype=np.int64)
        idx = idx[rng.permutation(len(idx))]
        sizes = counts(len(idx)) if callable(counts) else counts
        if not parts:
            parts = [[] for _ in range(len(sizes) + 1)]
        start = 0
        for j, n in enumerate(sizes):
            parts[j].append(idx[start : start + n])
            start += n
        parts[-1].append(idx[start:])
    if not parts:  # no labels at all
        n_parts = 1 + len(counts(0) if callable(counts) else counts)
        return [np.zeros(0, dtype=np.int64) for _ in range(n_parts)]
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
