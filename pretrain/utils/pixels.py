"""uint8 images to the float input of the encoders: one implementation for the data path and the
model (:meth:`pretrain.modeling.MultiViewMoCo.backbone_features`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pretrain.utils.compiled import in_compiled_graph
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from pretrain.utils.device import to_device

__all__ = ["normalize_", "to_unit_float"]


def to_unit_float(v: torch.Tensor) -> torch.Tensor:
    """uint8 images -> contiguous float32 in [0, 1] (as torchvision's ``ToTensor``)."""
    return v.to(torch.float32, memory_format=torch.contiguous_format).div_(255.0)


def normalize_(
    x: torch.Tensor,
    mean: Sequence[float] = IMAGENET_MEAN_RGB,
    std: Sequence[float] = IMAGENET_STD_RGB,
) -> torch.Tensor:
    """In place ``(x - mean) / std`` per channel of float (n, 3, h, w) images in [0, 1], as
    torchvision's ``Normalize``; returns ``x``."""
    m, s = _constants(tuple(mean), tuple(std), x.dtype, x.device)
    return x.sub_(m).div_(s)


# (mean, std, dtype, device) -> their (1, 3, 1, 1) tensors on that device: copied once, not in
# every step (a CUDA graph would bake in the address of each step's host buffer)
_CONSTANTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(
    mean: tuple, std: tuple, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    if in_compiled_graph():  # constants of the graph
        return tuple(
            torch.tensor(v, dtype=dtype, device=device).view(1, 3, 1, 1) for v in (mean, std)
        )
    key = (mean, std, dtype, device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = tuple(
            to_device(torch.tensor(v, dtype=dtype), device).view(1, 3, 1, 1) for v in (mean, std)
        )
    return _CONSTANTS[key]
