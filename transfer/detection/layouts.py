"""Where the ResNet of a converted backbone lives inside each detectron2 model, and the renaming
that lets one converted file serve them all.

A converted file names detectron2's ResNet (``stem.*``, ``res2.*`` .. ``res5.*``) under the
prefix of one layout (the converter writes the FPN one, which a plain detectron2 FPN config loads
as is). Models keep the stages in different places: the FPN backbones wrap the ResNet as
``backbone.bottom_up``; a C4 R-CNN keeps stem..res4 as ``backbone`` and res5 inside its ROI head
(``roi_heads.res5``); DeepLab's backbone (``build_resnet_deeplab_backbone``) *is* the ResNet, so
every stage sits directly under ``backbone`` (its dilation changes strides, not parameter names;
the DeepLab configs here use the 7x7 ``basic`` stem, so every converted weight has a place).
:func:`rename_for_model` rewrites a file's names to the layout of the model
it is loaded into, from the model's own keys; a file that is not a bare backbone (a trained
model, a checkpoint) is left as it is, and names are then matched exactly.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import TypeVar

__all__ = [
    "BACKBONE_LAYOUTS",
    "STAGES",
    "canonical_name",
    "is_resnet_weight",
    "model_layout",
    "rename_for_model",
]

STAGES = ("stem", "res2", "res3", "res4", "res5")

# layout -> {stage: prefix of that stage's names in the model}. A layout is recognised by the
# model having names under every one of its stage prefixes, so no two may share them all.
BACKBONE_LAYOUTS: dict[str, dict[str, str]] = {
    # build_resnet_fpn_backbone: FPN R-CNNs and Semantic FPN
    "fpn": dict.fromkeys(STAGES, "backbone.bottom_up."),
    # Res5ROIHeads (and Res5ROIHeadsExtraNorm): C4 R-CNNs compute res5 per region
    "c4": {**dict.fromkeys(STAGES[:4], "backbone."), "res5": "roi_heads."},
    # build_resnet_deeplab_backbone (detectron2.projects.deeplab): DeepLabV3(+); the C4 layout
    # shares its stem..res4 prefixes but keeps res5 under roi_heads, so the two never both match
    "deeplab": dict.fromkeys(STAGES, "backbone."),
}

# The weights a converted backbone holds: the stem and the blocks of res2..res5 (not, e.g., the
# extra norm after res5 of Res5ROIHeadsExtraNorm, which the ResNet has no counterpart of).
_RESNET_WEIGHT = re.compile(r"^(stem\.|res[2-5]\.\d+\.)")

T = TypeVar("T")


def is_resnet_weight(canonical: str) -> bool:
    """Whether a canonical name (``res3.1.conv2.weight``) is a weight of a converted ResNet."""
    return _RESNET_WEIGHT.match(canonical) is not None


def canonical_name(name: str, layout: Mapping[str, str] | None = None) -> str | None:
    """``name`` without the prefix of its stage in ``layout`` (any known layout, or none: a bare
    ``stem.*``/``resN.*`` name, when ``layout`` is None); None when it names no ResNet stage."""
    layouts = [layout] if layout is not None else [{}, *BACKBONE_LAYOUTS.values()]
    for stages in layouts:
        for stage in STAGES:
            prefix = stages.get(stage, "") + stage + "."
            if name.startswith(prefix):
                return name[len(stages.get(stage, "")) :]
    return None


def model_layout(model_keys: Collection[str]) -> str | None:
    """The name of the layout in :data:`BACKBONE_LAYOUTS` whose every stage the model has (its
    ``state_dict`` keys), or None."""
    for name, stages in BACKBONE_LAYOUTS.items():
        if all(any(k.startswith(stages[s] + s + ".") for k in model_keys) for s in STAGES):
            return name
    return None


def rename_for_model(weights: Mapping[str, T], model_keys: Collection[str]) -> dict[str, T]:
    """``weights`` renamed to the layout of the model whose keys are ``model_keys``, when the
    file is a bare backbone (every name a ResNet stage, in any layout) and the model's layout is
    known; otherwise ``weights`` as they are."""
    layout = model_layout(model_keys)
    if layout is None or not weights:
        return dict(weights)
    canonical = {name: canonical_name(name) for name in weights}
    if any(c is None for c in canonical.values()):
        return dict(weights)
    stages = BACKBONE_LAYOUTS[layout]
    return {stages[c.split(".", 1)[0]] + c: weights[n] for n, c in canonical.items()}
