"""Check that a weights file fits a built model before detectron2 loads it, and load it: its
checkpointer only logs skipped keys, so R18 weights in an R50 model, or a C4 model's res5 left
out of the file, would train a half-random backbone. A converted backbone is renamed to the
model's layout (:mod:`.layouts`) by both the check and :class:`LayoutCheckpointer`, so one file
serves FPN, C4 and DeepLab models. ``.pkl`` files are read with the restricted unpickler of
:mod:`transfer.checkpoint.safe_pickle` (unpickling runs whatever callables a file names),
``.pth`` with ``weights_only=True``.
"""

from __future__ import annotations

import os
import re

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.utils.file_io import PathManager
from torch import nn

from transfer.checkpoint.safe_pickle import UnsafePickleError as SafePickleRefusal
from transfer.checkpoint.safe_pickle import load_safe_pickle

from .config import DetectionSetupError
from .convert import key_listing
from .layouts import (
    BACKBONE_LAYOUTS,
    STAGES,
    canonical_name,
    is_resnet_weight,
    model_layout,
    rename_for_model,
)

__all__ = [
    "LayoutCheckpointer",
    "UnsafePickleError",
    "check_weights_fit",
    "load_d2_pickle",
    "read_model_weights",
    "required_backbone_keys",
]

# Buffers that detectron2 rebuilds from the config and ignores when loading (see
# DetectionCheckpointer): never required in, nor an error in, a weights file.
_IGNORED = ("pixel_mean", "pixel_std", "anchor_generator.cell_anchors")


class UnsafePickleError(DetectionSetupError):
    """A ``.pkl`` that names a global outside ``SAFE_PICKLE_GLOBALS`` (nothing was run)."""


def load_d2_pickle(path: str) -> dict:
    """The dict in the detectron2 ``.pkl`` weights file ``path``, unpickled safely; another
    global raises :class:`UnsafePickleError`, any other problem :class:`DetectionSetupError`."""
    if not os.path.isfile(path):
        raise DetectionSetupError(f"{path}: no such file")
    try:
        data = load_safe_pickle(path)
    except SafePickleRefusal as e:
        raise UnsafePickleError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - pickle raises many types on bad files
        raise DetectionSetupError(
            f"{path}: not a readable weights pickle ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(data, dict):
        raise DetectionSetupError(
            f"{path}: expected a dict of weights, found {type(data).__name__}"
        )
    return data


# blocks per stage (res2..res5) -> depth, for basic-block and bottleneck ResNets
_DEPTHS = {
    (False, (2, 2, 2, 2)): 18,
    (False, (3, 4, 6, 3)): 34,
    (True, (3, 4, 6, 3)): 50,
    (True, (3, 4, 23, 3)): 101,
    (True, (3, 8, 36, 3)): 152,
}
_BLOCK = re.compile(r"(?:^|\.)res([2-5])\.(\d+)\.conv(\d)\.weight$")


def weights_depth(names: list[str]) -> int | None:
    """The ResNet depth of converted weights, from their res2..res5 block names (None: not
    one of 18, 34, 50, 101, 152)."""
    blocks: dict[int, set[int]] = {}
    bottleneck = False
    for name in names:
        m = _BLOCK.search(name)
        if m:
            blocks.setdefault(int(m[1]), set()).add(int(m[2]))
            bottleneck |= m[3] == "3"
    counts = tuple(len(blocks.get(stage, ())) for stage in range(2, 6))
    return _DEPTHS.get((bottleneck, counts))


def read_model_weights(path: str, what: str = "MODEL.WEIGHTS") -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model weights in a detectron2 ``.pkl`` or torch ``.pth`` file."""
    local = PathManager.get_local_path(path)
    if not os.path.isfile(local):
        raise DetectionSetupError(f"{what} {path}: no such file")
    if local.endswith(".pkl"):
        try:
            data = load_d2_pickle(local)
        except DetectionSetupError as e:
            raise DetectionSetupError(f"{what} {e}") from None
    else:
        try:
            data = torch.load(local, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - pickle/torch raise many types on bad files
            raise DetectionSetupError(
                f"{what} {path}: not a readable weights file ({type(e).__name__})"
            ) from None
    if not isinstance(data, dict):
        raise DetectionSetupError(f"{what} {path}: expected a dict of weights")
    weights = data.get("model", data)
    if isinstance(weights, dict) and "blobs" in weights:
        raise DetectionSetupError(
            f"{what} {path}: Caffe2 'blobs' files need name heuristics; convert the "
            "weights with tools/convert_to_d2.py instead"
        )
    return {k: tuple(getattr(v, "shape", ())) for k, v in weights.items() if hasattr(v, "shape")}


def required_backbone_keys(model_keys: list[str]) -> list[str]:
    """The keys of the model's ResNet a converted backbone must fill: stem and res2..res5
    blocks wherever the model's layout keeps them (the C4 head's ``roi_heads.res5`` included);
    for a model of no known layout, every ``backbone.`` key."""
    layout = model_layout(model_keys)
    if layout is None:
        return [k for k in model_keys if k.startswith("backbone.")]
    stages = BACKBONE_LAYOUTS[layout]
    return [
        k
        for k in model_keys
        if (c := canonical_name(k, stages)) is not None and is_resnet_weight(c)
    ]


def _missing_listing(missing: list[str], model_keys: list[str]) -> str:
    """Missing keys for a message, by ResNet stage where the model's layout is known
    (``roi_heads.res5.* (159 keys, e.g. ...)``), else the first few names."""
    layout = model_layout(model_keys)
    if layout is None:
        return key_listing(missing, 6)
    stages: dict[str, list[str]] = {}
    others = []
    for k in missing:
        c = canonical_name(k, BACKBONE_LAYOUTS[layout])
        if c is None:
            others.append(k)
        else:
            stages.setdefault(k[: len(k) - len(c)] + c.split(".", 1)[0], []).append(k)
    listed = [f"{g}.* ({len(ks)} keys, e.g. {ks[0]})" for g, ks in stages.items()]
    return ", ".join(listed + ([key_listing(others, 6)] if others else []))


def _absent_stages(found: dict, required: list[str]) -> list[str]:
    """The ResNet stages (``res5 (torchvision's layer4)``) of which the file holds no weight
    although the model requires some."""
    names = [canonical_name(k) for k in found]
    absent = []
    for stage in STAGES:
        needed = any((c := canonical_name(k)) and c.startswith(stage + ".") for k in required)
        if needed and not any(c and c.startswith(stage + ".") for c in names):
            layer = "conv1/bn1" if stage == "stem" else f"layer{int(stage[3]) - 1}"
            absent.append(f"{stage} (torchvision's {layer})")
    return absent


def check_weights_fit(
    model: nn.Module, path: str, required_prefix: str | None = None, what: str = "MODEL.WEIGHTS"
) -> None:
    """Raise :class:`DetectionSetupError` unless every name in ``path`` is in ``model`` with
    its shape and every model key starting with ``required_prefix`` is in the file (``""``: all;
    ``None``: the backbone's ResNet, :func:`required_backbone_keys`), after renaming a converted
    backbone to the model's layout. ``what`` names the file in the message."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    expected = {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if not any(token in k for token in _IGNORED)
    }
    found = rename_for_model(read_model_weights(path, what), list(expected))
    if required_prefix is None:
        required = required_backbone_keys(list(expected))
    else:
        required = [k for k in expected if k.startswith(required_prefix)]
    unexpected = sorted(k for k in found if k not in expected and not any(t in k for t in _IGNORED))
    wrong = sorted(k for k in found if k in expected and found[k] != expected[k])
    missing = sorted(k for k in required if k not in found)
    if found and not any(k in expected for k in found):
        # no name of a detectron2 model at all: a pretraining/torchvision/MoCo checkpoint
        raise DetectionSetupError(
            f"{what} {path} is not a detectron2 weights file (its keys, e.g. "
            f"{key_listing(sorted(found), 3)}, name no parameter of the model): convert it first, "
            f"e.g. python tools/convert_to_d2.py {path} pretrained/backbone.pkl"
        )
    if unexpected or wrong or missing:
        parts = []
        if wrong:
            shapes = [f"{k} {found[k]} vs model {expected[k]}" for k in wrong]
            parts.append(f"shape mismatch {key_listing(shapes, 3)}")
        if missing:
            parts.append(f"missing {_missing_listing(missing, list(expected))}")
        if unexpected:
            parts.append(f"not in the model {key_listing(unexpected, 6)}")
        depth, model_depth = weights_depth(sorted(found)), weights_depth(sorted(expected))
        absent = _absent_stages(found, required)
        hint = (
            "its run used another config"
            if what == "checkpoint"
            else f"the weights are a ResNet-{depth}, the model a ResNet-{model_depth}: add "
            f"MODEL.RESNETS.DEPTH {depth}"
            if depth and model_depth and depth != model_depth
            else f"the weights have no {', '.join(absent)}: convert the whole backbone"
            if absent
            else "check MODEL.RESNETS.DEPTH and the converter's arch"
        )
        raise DetectionSetupError(
            f"{what} {path} does not fit the model built from the config ({hint}): "
            f"{'; '.join(parts)}"
        )


class LayoutCheckpointer(DetectionCheckpointer):
    """detectron2's ``DetectionCheckpointer`` that reads ``.pkl`` files with the restricted
    unpickler and renames a converted backbone to the model's layout (:func:`rename_for_model`)
    before loading it by exact names. It overrides ``_load_file``, the hook fvcore's
    ``Checkpointer`` documents for other file formats; checkpoints it saves are unchanged."""

    def _load_file(self, filename: str) -> dict:
        if filename.endswith(".pkl"):
            data = load_d2_pickle(filename)
            if "model" not in data or "__author__" not in data:
                raise DetectionSetupError(
                    f"{filename}: not a detectron2 model-zoo file (no 'model'/'__author__'); "
                    "convert the weights with tools/convert_to_d2.py"
                )
        else:
            data = super()._load_file(filename)
        keys = list(self.model.state_dict())
        data["model"] = rename_for_model(data["model"], keys)
        if data.get("__author__") == "lorac":
            data["matching_heuristics"] = False  # names are exact: never guessed
        return data
