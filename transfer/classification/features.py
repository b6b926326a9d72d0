"""The on-disk cache of frozen features (:func:`pretrain.evaluation.features.extract_features`):
one file per (backbone, dataset, split), keyed by a hash of the backbone's identity, the data
(name, root, size, labels), the transform's ``repr`` and the storage dtype, so a stale file is
never read. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from pretrain.data.datasets import TransformedDataset
from pretrain.evaluation.features import extract_features
from pretrain.utils.atomic_io import atomic_replace
from pretrain.utils.errors import DatasetError

from .backbone import EvalBackbone

__all__ = ["FeatureCache", "cached_features", "check_index_labels", "labels_digest"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def labels_digest(labels: torch.Tensor | np.ndarray) -> str:
    """Short content hash of a label vector (part of the cache key)."""
    return hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest()[:16]


def check_index_labels(what: str, labels: torch.Tensor, expected: torch.Tensor) -> None:
    """The labels of the features of ``what`` are those of its index. A dataset whose splits
    are drawn by index (the 12-dataset harness) cannot leave out an image the loader skipped as
    unreadable (warned above): :class:`DatasetError` naming the fix."""
    if len(labels) < len(expected):
        raise DatasetError(
            f"{what}: {len(expected) - len(labels)} of {len(expected)} images are unreadable "
            "(named in the warnings above); this dataset's splits are drawn by index, so restore "
            "those files from the original archive"
        )
    if not torch.equal(labels, expected):
        raise RuntimeError(f"{what}: labels from the loader differ from the index")


class FeatureCache:
    """Feature files in ``directory`` (no caching at all when ``directory`` is empty)."""

    def __init__(self, directory: str = "", dtype: str = "float32") -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"feature cache dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        self.directory = directory
        self.dtype = dtype
        self.hits = 0
        self.misses = 0

    def key(self, parts: dict) -> str:
        blob = json.dumps({**parts, "dtype": self.dtype}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, parts: dict) -> str:
        name = f"{parts.get('dataset', 'data')}-{parts.get('split', 'split')}"
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return os.path.join(self.directory, f"{safe}-{self.key(parts)[:24]}.pt")

    def get_or_compute(
        self, parts: dict, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached ``(features, labels)`` for ``parts`` or the result of ``compute()`` (stored)."""
        if not self.directory:
            self.misses += 1
            return compute()
        path, key = self.path(parts), self.key(parts)
        if os.path.isfile(path):
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if obj.get("key") == key:
                self.hits += 1
                logger.info("feature cache hit: %s", path)
                return obj["features"].float(), obj["labels"]
            logger.warning("feature cache file %s has another key; recomputing", path)
        self.misses += 1
        feats, labels = compute()
        os.makedirs(self.directory, exist_ok=True)
        stored = feats.to(_DTYPES[self.dtype])
        meta = json.dumps(parts, default=str)
        record = {"key": key, "parts": meta, "features": stored, "labels": labels}
        atomic_replace(path, lambda f: torch.save(record, f))
        logger.info("feature cache write: %s (%s)", path, tuple(feats.shape))
        return stored.float(), labels


def cached_features(
    cache: FeatureCache,
    backbone: EvalBackbone,
    images: Dataset,
    transform: Callable,
    parts: dict,
    device: torch.device | str,
    batch_size: int,
    num_workers: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``backbone``'s features and labels of ``images`` through ``transform``: from ``cache``
    under ``parts`` (``dataset``, ``split``, ...) with the backbone and transform, or extracted."""
    parts = {"backbone": backbone.identity, "transform": repr(transform), **parts}

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        data = TransformedDataset(images, transform)
        desc = f"{parts['dataset']}/{parts['split']} features"
        return extract_features(backbone.model, data, device, batch_size, num_workers, desc=desc)

    return cache.get_or_compute(parts, compute)
