"""Check that a weights file fits a built model before detectron2 loads it.

detectron2's checkpointer only logs keys it skipped or whose shapes differ, so R18 weights loaded
into an R50 model would train from a silently half-random backbone. :func:`check_weights_fit`
compares the file's names and shapes with ``model.state_dict()`` and raises
:class:`DetectionSetupError` naming the keys instead.
"""

from __future__ import annotations

import os
import pickle

import torch
from detectron2.utils.file_io import PathManager
from torch import nn

from .config import DetectionSetupError

__all__ = ["check_weights_fit", "read_model_weights"]

# Buffers that detectron2 rebuilds from the config and ignores when loading (see
# DetectionCheckpointer): never required in, nor an error in, a weights file.
_IGNORED = ("pixel_mean", "pixel_std", "anchor_generator.cell_anchors")


def _listing(keys: list[str], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" ... ({len(keys)} in all)" if len(keys) > limit else "")


def read_model_weights(path: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model weights in a detectron2 ``.pkl`` or torch ``.pth`` file."""
    local = PathManager.get_local_path(path)
    if not os.path.isfile(local):
        raise DetectionSetupError(f"MODEL.WEIGHTS {path}: no such file")
    try:
        if local.endswith(".pkl"):
            with open(local, "rb") as f:
                data = pickle.load(f, encoding="latin1")
        else:
            data = torch.load(local, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle/torch raise many types on bad files
        raise DetectionSetupError(
            f"MODEL.WEIGHTS {path}: not a readable weights file ({type(e).__name__})"
        ) from None
    if not isinstance(data, dict):
        raise DetectionSetupError(f"MODEL.WEIGHTS {path}: expected a dict of weights")
    weights = data.get("model", data)
    if isinstance(weights, dict) and "blobs" in weights:
        raise DetectionSetupError(
            f"MODEL.WEIGHTS {path}: Caffe2 'blobs' files need name heuristics; convert the "
            "weights with tools/convert_to_d2.py instead"
        )
    return {k: tuple(getattr(v, "shape", ())) for k, v in weights.items() if hasattr(v, "shape")}


def check_weights_fit(model: nn.Module, path: str, required_prefix: str | None = None) -> None:
    """Raise :class:`DetectionSetupError` unless the weights in ``path`` fit ``model``.

    Every name in the file must exist in ``model`` with the same shape. Every model key starting
    with ``required_prefix`` must be in the file (``""``: all keys, for evaluating a trained
    model; ``None``: the ResNet of the backbone, ``backbone.bottom_up.`` for FPN models, for
    initialising a detector from a converted backbone).
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    expected = {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if not any(token in k for token in _IGNORED)
    }
    found = read_model_weights(path)
    if required_prefix is None:
        fpn = any(k.startswith("backbone.bottom_up.") for k in expected)
        required_prefix = "backbone.bottom_up." if fpn else "backbone."
    unexpected = sorted(k for k in found if k not in expected and not any(t in k for t in _IGNORED))
    wrong = sorted(k for k in found if k in expected and found[k] != expected[k])
    missing = sorted(k for k in expected if k.startswith(required_prefix) and k not in found)
    if unexpected or wrong or missing:
        parts = []
        if wrong:
            shapes = [f"{k} {found[k]} vs model {expected[k]}" for k in wrong]
            parts.append(f"shape mismatch {_listing(shapes, 3)}")
        if missing:
            parts.append(f"missing {_listing(missing)}")
        if unexpected:
            parts.append(f"not in the model {_listing(unexpected)}")
        raise DetectionSetupError(
            f"MODEL.WEIGHTS {path} does not fit the model built from the config (check "
            f"MODEL.RESNETS.DEPTH and the converter's arch): {'; '.join(parts)}"
        )
