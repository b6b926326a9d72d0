"""The two image pipelines of the MoCo linear-evaluation protocol, sizes configurable; their
``repr`` is stable (no memory addresses): it is part of the feature-cache key.
"""

from __future__ import annotations

from PIL import Image
from torchvision import transforms as T

from pretrain.data.datasets import to_rgb
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB

__all__ = ["ToRGB", "eval_transform", "train_transform"]


class ToRGB:
    """:func:`pretrain.data.datasets.to_rgb` (greyscale, palette, 16-bit PNGs to RGB); a class
    rather than ``T.Lambda`` for a stable ``repr``."""

    def __call__(self, img: Image.Image) -> Image.Image:
        return to_rgb(img)

    def __repr__(self) -> str:
        return "ToRGB()"


def _check(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def train_transform(crop: int = 224) -> T.Compose:
    """RandomResizedCrop(crop) + flip + normalise (MoCo ``main_lincls.py`` training pipeline)."""
    _check("crop", crop)
    return T.Compose(
        [
            ToRGB(),
            T.RandomResizedCrop(crop),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB),
        ]
    )


def eval_transform(resize: int = 256, crop: int = 224) -> T.Compose:
    """Resize(resize) + CenterCrop(crop) + normalise (evaluation and frozen-feature pipeline)."""
    _check("resize", resize)
    _check("crop", crop)
    if crop > resize:
        raise ValueError(f"crop ({crop}) must not exceed resize ({resize})")
    return T.Compose(
        [
            ToRGB(),
            T.Resize(resize),
            T.CenterCrop(crop),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB),
        ]
    )
