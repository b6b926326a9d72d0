"""A short content hash of a backbone's weights: what keys a model's row in the results tables.

The hash reads the tensors, not the file: the same weights saved by another tool, in another
layout or converted to detectron2's names hash alike. ``num_batches_tracked`` is left out (a
counter evaluation never reads, which detectron2's converted files do not hold).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

__all__ = ["DIGEST_CHARS", "weights_digest"]

DIGEST_CHARS = 8  # hex digits of the sha256 shown in tables: 1 in 4e9 for two models to collide


def weights_digest(state_dict: Mapping[str, torch.Tensor], chars: int = DIGEST_CHARS) -> str:
    """The first ``chars`` hex digits of a sha256 over ``state_dict``'s names, dtypes, shapes and
    values, in name order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        if name.endswith("num_batches_tracked"):
            continue
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:chars]
