"""Multi-crop views for pretraining: random resized crops and flips of one image, as uint8 tensors.

``MultiCropTransform`` runs in the data loader workers and does only what must see the full
image (crop, resize, flip); the views stay uint8 (a quarter of float32's bytes through IPC and the
host-to-device copy) and the photometric ops run batched on the device
(``pretrain.data.color.BatchColorAugment``), or here with ``color_on_device=False``.

Crops are drawn as torchvision's ``RandomResizedCrop.get_params`` and resized as
``transforms.v2.functional.resized_crop`` does on a uint8 channels-last tensor (torch's native
antialiased kernel, ~4x faster than PIL's resize), called directly without its dispatch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image

from pretrain.data.color import ColorSpec, Jitter, apply_color_params, sample_color_params
from pretrain.data.datasets import rgb_tensor, to_rgb
from pretrain.utils.pixels import to_unit_float

__all__ = [
    "ColorSpec",
    "CropSpec",
    "MultiCropTransform",
    "image_to_tensor",
    "mocov2_specs",
    "multicrop_specs",
    "sample_crop_boxes",
]

# torchvision's RandomResizedCrop tries this many (scale, ratio) draws before a central crop.
_CROP_ATTEMPTS = 10


@dataclass(frozen=True)
class CropSpec:
    """``count`` random resized crops of side ``size`` (``scale`` and ``ratio`` as in
    ``RandomResizedCrop``), each flipped horizontally with probability ``flip_prob``."""

    size: int
    scale: tuple[float, float]
    count: int
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.5

    def __post_init__(self) -> None:
        if self.size <= 0 or self.count <= 0:
            raise ValueError(f"size and count must be positive, got {self.size}, {self.count}")
        lo, hi = self.scale
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        r_lo, r_hi = self.ratio
        if not 0.0 < r_lo <= r_hi:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio}")
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be in [0, 1], got {self.flip_prob}")


def multicrop_specs(
    large_size: int = 224,
    small_size: int = 96,
    large_count: int = 3,
    small_count: int = 5,
    large_scale: tuple[float, float] = (0.14, 1.0),
    small_scale: tuple[float, float] = (0.05, 0.14),
) -> tuple[list[CropSpec], ColorSpec]:
    """The paper's multi-crop views (3x224 + 5x96 by default) and SwAV's colour distortion."""
    crops = [CropSpec(large_size, large_scale, large_count)]
    if small_count > 0:
        crops.append(CropSpec(small_size, small_scale, small_count))
    return crops, ColorSpec()


def mocov2_specs() -> tuple[list[CropSpec], ColorSpec]:
    """MoCo-v2's two 224 views: scale (0.2, 1), jitter (0.4, 0.4, 0.4, 0.1), blur p = 0.5."""
    return [CropSpec(224, (0.2, 1.0), 2)], ColorSpec().replace(Jitter((0.4, 0.4, 0.4, 0.1)))


def sample_crop_boxes(
    width: int,
    height: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    count: int,
    generator: torch.Generator | None = None,
) -> list[tuple[int, int, int, int]]:
    """``count`` crop boxes ``(top, left, height, width)`` of a ``width`` x ``height`` image, as
    ``RandomResizedCrop.get_params`` draws them; the uniforms of all attempts are drawn at once,
    so that the generator's stream per call is fixed."""
    draws = torch.rand(count, _CROP_ATTEMPTS, 4, generator=generator, dtype=torch.float64)
    log_r0, log_r1 = math.log(ratio[0]), math.log(ratio[1])
    area = width * height
    boxes = []
    for attempts in draws.tolist():
        box = None
        for u_area, u_ratio, u_top, u_left in attempts:
            target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
            aspect = math.exp(log_r0 + (log_r1 - log_r0) * u_ratio)
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                # floor(u * (n + 1)) is a uniform integer in [0, n], like torch.randint.
                box = (int(u_top * (height - h + 1)), int(u_left * (width - w + 1)), h, w)
                break
        boxes.append(box if box is not None else _central_box(width, height, ratio))
    return boxes


def _central_box(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's fallback: the largest central crop whose ratio is clamped into range."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def image_to_tensor(img: Image.Image | torch.Tensor) -> torch.Tensor:
    """RGB PIL image or uint8 (H, W, 3) tensor -> uint8 (1, 3, H, W) channels-last view."""
    hwc = rgb_tensor(img) if isinstance(img, Image.Image) else img
    return hwc.permute(2, 0, 1).unsqueeze(0)


def _crop_resize(
    image: torch.Tensor, box: tuple[int, int, int, int], size: int, flip: bool
) -> torch.Tensor:
    """Contiguous uint8 (3, size, size) view of ``box`` of a (1, 3, H, W) uint8 image: torchvision's
    ``resized_crop(..., antialias=True)`` step for step, its restriding of a channels-last batch
    dimension (pytorch/pytorch#68430) included, so the pixels are the same."""
    top, left, h, w = box
    crop = image[..., top : top + h, left : left + w]
    if (h, w) != (size, size):
        strides = crop.stride()
        if crop.is_contiguous(memory_format=torch.channels_last) and crop.numel() != strides[0]:
            crop = crop.as_strided(crop.shape, (crop.numel(), *strides[1:]))
        crop = F.interpolate(
            crop, size=[size, size], mode="bilinear", align_corners=False, antialias=True
        )
    out = crop[0]
    return (out.flip(-1) if flip else out).contiguous()


class MultiCropTransform:
    """RGB image -> list of uint8 (3, size, size) views, all crops of ``crops[0]`` first; every
    random choice comes from the per-sample generator, so a seed reproduces the views."""

    def __init__(
        self,
        crops: Sequence[CropSpec],
        color: ColorSpec,
        color_on_device: bool = True,
    ) -> None:
        if not crops:
            raise ValueError("at least one CropSpec is needed")
        self.crops = tuple(crops)
        self.color = color
        self.color_on_device = color_on_device

    @property
    def num_views(self) -> int:
        """Number of views per image (sum of the crop counts)."""
        return sum(spec.count for spec in self.crops)

    def __call__(
        self, img: Image.Image | torch.Tensor, generator: torch.Generator
    ) -> list[torch.Tensor]:
        """The views of ``img`` (a PIL image, or a uint8 (H, W, 3) RGB tensor) in crop order;
        colour too unless ``color_on_device``."""
        image = image_to_tensor(to_rgb(img) if isinstance(img, Image.Image) else img)
        height, width = image.shape[-2:]
        views: list[torch.Tensor] = []
        for spec in self.crops:
            boxes = sample_crop_boxes(width, height, spec.scale, spec.ratio, spec.count, generator)
            flips = torch.rand(spec.count, generator=generator) < spec.flip_prob
            crops = [
                _crop_resize(image, box, spec.size, flip)
                for box, flip in zip(boxes, flips.tolist(), strict=True)
            ]
            if not self.color_on_device:
                crops = self._color(torch.stack(crops), generator).unbind(0)
            views.extend(crops)
        return views

    def _color(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Colour-augment uint8 (n, 3, s, s) views of one image; rounds back to uint8 once."""
        params = sample_color_params(x.shape[0], self.color, generator)
        y = apply_color_params(to_unit_float(x), params, self.color)
        return y.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(crops={list(self.crops)}, color={self.color}, "
            f"color_on_device={self.color_on_device})"
        )
