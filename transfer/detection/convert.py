"""Convert a ResNet backbone (any layout :mod:`transfer.checkpoint.reader` reads) to detectron2
names (:mod:`transfer.checkpoint.resnet_names`). Every input key must map and every key of the
torchvision architecture be present, else :class:`ConversionError` names the keys. Files are
written for exact loading (``matching_heuristics: False``) under the prefix of the ResNet in the
model; torchvision's bottleneck strides in the 3x3 conv (``STRIDE_IN_1X1: False`` in the configs).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field

import torch
import torchvision

from pretrain.utils.errors import LoracError
from transfer.checkpoint.reader import BackboneWeights, load_backbone
from transfer.checkpoint.resnet_names import torchvision_to_d2_name
from transfer.export.backbone import is_same_file

__all__ = [
    "FPN_PREFIX",
    "ConversionError",
    "ConversionReport",
    "convert_checkpoint",
    "convert_to_d2",
    "key_listing",
    "torchvision_to_d2_name",
]

# Where detectron2's build_resnet_fpn_backbone keeps the ResNet inside GeneralizedRCNN.
FPN_PREFIX = "backbone.bottom_up."


class ConversionError(LoracError):
    """Weights that cannot be converted; the message names the offending keys."""


@dataclass
class ConversionReport:
    """What :func:`convert_checkpoint` did."""

    input_path: str
    output_path: str
    arch: str
    source_format: str
    num_converted: int
    prefix: str
    dropped: list[str] = field(default_factory=list)  # input keys dropped on purpose


def key_listing(keys: list[str], limit: int = 8) -> str:
    """The first ``limit`` of ``keys`` for a message, and how many there are in all."""
    return ", ".join(keys[:limit]) + (f" ... ({len(keys)} in all)" if len(keys) > limit else "")


# Why a small-stem checkpoint (pretrain.modeling.encoder.STEMS) is refused, not converted.
D2_STEM_UNSUPPORTED = (
    "the backbone is not converted to detectron2 weights: it has the {stem!r} stem (3x3 "
    "stride-1 conv, no max-pool) and detectron2's ResNet stem is always a 7x7 stride-2 conv "
    "followed by a max-pool"
)


def convert_to_d2(weights: BackboneWeights, prefix: str = "") -> dict[str, torch.Tensor]:
    """Map torchvision ResNet backbone weights to detectron2 ResNet names (``prefix`` prepended)."""
    if weights.arch not in torchvision.models.__dict__:
        raise ConversionError(f"unknown ResNet architecture {weights.arch!r}")
    if weights.stem != "imagenet":
        raise ConversionError(D2_STEM_UNSUPPORTED.format(stem=weights.stem))
    expected = {
        k
        for k in torchvision.models.__dict__[weights.arch]().state_dict()
        if not k.startswith("fc.")
    }
    missing = sorted(expected - set(weights.state_dict))
    if missing:
        raise ConversionError(f"{weights.arch} backbone keys missing: {key_listing(missing)}")
    out: dict[str, torch.Tensor] = {}
    unmapped = []
    for key, value in weights.state_dict.items():
        name = torchvision_to_d2_name(key) if key in expected else None
        if name is None:
            unmapped.append(key)
        else:
            out[prefix + name] = value.detach().cpu()
    if unmapped:
        raise ConversionError(f"keys with no detectron2 name: {key_listing(sorted(unmapped))}")
    return out


def convert_checkpoint(
    input_path: str, output_path: str, prefix: str = FPN_PREFIX
) -> ConversionReport:
    """Read a backbone from ``input_path`` and write it for detectron2 to ``output_path``:
    ``.pkl`` in detectron2's model-zoo format (numpy arrays), ``.pth`` as torch tensors."""
    ext = os.path.splitext(output_path)[1]
    if ext not in (".pkl", ".pth"):
        raise ConversionError(f"{output_path}: output must end in .pkl or .pth, not {ext!r}")
    if is_same_file(input_path, output_path):
        raise ConversionError(
            f"{output_path}: is the input checkpoint {input_path}; write the detectron2 weights "
            "to another file"
        )
    weights = load_backbone(input_path)
    model = convert_to_d2(weights, prefix=prefix)
    if os.path.dirname(output_path):
        os.makedirs(os.path.dirname(output_path), exist_ok=True)
    if ext == ".pkl":
        payload = {k: v.numpy() for k, v in model.items()}
        with open(output_path, "wb") as f:
            pickle.dump({"model": payload, "__author__": "lorac", "matching_heuristics": False}, f)
    else:
        torch.save(
            {"model": model, "__author__": "lorac", "matching_heuristics": False}, output_path
        )
    return ConversionReport(
        input_path=input_path,
        output_path=output_path,
        arch=weights.arch,
        source_format=weights.source_format,
        num_converted=len(model),
        prefix=prefix,
        dropped=list(weights.dropped),
    )
