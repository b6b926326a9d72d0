"""The on-disk cache of frozen features of the transfer evaluations.

Features themselves come from :func:`pretrain.evaluation.features.extract_features` (the
backbone's globally pooled output, eval mode, no gradients). The cache stores one file per
(backbone, dataset, split) under a key that hashes the backbone identity (checkpoint SHA-256 or
random-init recipe), the dataset name and root, the split name, its size and labels, the
transform's ``repr`` and the storage dtype; any change gives a new key, so a stale file is never
read. Files are written atomically (temporary file + rename).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable

import torch

from pretrain.utils.atomic_io import atomic_replace

__all__ = ["FeatureCache", "labels_digest"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def labels_digest(labels: torch.Tensor) -> str:
    """Short content hash of a label vector (part of the cache key)."""
    return hashlib.sha256(labels.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


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
