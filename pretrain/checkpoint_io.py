"""Read a ResNet backbone out of a checkpoint, whatever tool wrote it.

Three layouts are understood, detected from the keys (never guessed by partial matching):

* ``lorac``: this project's pretraining checkpoints (fvcore ``Checkpointer`` format): a dict with
  ``model`` whose keys are ``encoder_q.backbone.<torchvision key>``; ``encoder_q.head.*``,
  ``encoder_k.*`` and the queues are dropped on purpose.
* ``moco``: the public LORAC / MoCo release layout: a dict with ``state_dict`` whose keys are
  ``module.encoder_q.<torchvision key>``, the MLP head under ``module.encoder_q.fc.*``, the key
  encoder under ``module.encoder_k.*`` and ``module.queue*`` buffers; all but the backbone dropped.
* ``torchvision``: a plain torchvision ResNet ``state_dict`` (the supervised baseline); the
  classifier ``fc.*`` is dropped.

The result always has exactly the keys of a torchvision ResNet without ``fc`` (verified against
the architecture inferred from the weights); anything missing or left over raises
:class:`CheckpointError` naming the keys. Files are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torchvision

__all__ = [
    "BackboneWeights",
    "CheckpointError",
    "extract_backbone",
    "infer_resnet_arch",
    "load_backbone",
    "load_checkpoint_file",
]

_DEPTHS = {  # blocks per stage -> (arch, bottleneck?)
    (2, 2, 2, 2, False): "resnet18",
    (3, 4, 6, 3, False): "resnet34",
    (3, 4, 6, 3, True): "resnet50",
    (3, 4, 23, 3, True): "resnet101",
    (3, 8, 36, 3, True): "resnet152",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot give a ResNet backbone; the message names the file and keys."""


@dataclass
class BackboneWeights:
    """A torchvision-keyed ResNet backbone state dict (no ``fc``) and where it came from."""

    state_dict: dict[str, torch.Tensor]
    arch: str
    source_format: str
    dropped: list[str] = field(default_factory=list)  # input keys dropped on purpose
    path: str = ""
    stem: str = "imagenet"  # "small": 3x3 stride-1 conv1, no max-pool (pretrain.modeling.encoder)


def _reference_backbone(arch: str, stem: str) -> torch.nn.Module:
    """An untrained torchvision ``arch`` with ``stem``, its ``fc`` replaced by ``Identity``."""
    from pretrain.modeling.encoder import set_stem

    model = set_stem(torchvision.models.__dict__[arch](), stem)
    model.fc = torch.nn.Identity()
    return model


def load_checkpoint_file(path: str) -> dict:
    """``torch.load(path, weights_only=True)`` with one-line errors instead of tracebacks."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: file is empty, not a checkpoint")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types on garbage input
        # Only the type: torch's own text advises weights_only=False, which would run pickled code.
        raise CheckpointError(
            f"{path}: not a readable PyTorch checkpoint ({type(e).__name__})"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict, found {type(obj).__name__}")
    return obj


def _tensor_items(d: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def _split(sd: dict[str, torch.Tensor], prefix: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    kept = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    dropped = sorted(k for k in sd if not k.startswith(prefix))
    return kept, dropped


def infer_resnet_arch(sd: dict[str, torch.Tensor]) -> str:
    """Name of the torchvision ResNet whose backbone keys ``sd`` has; raises if none fits."""
    blocks = []
    for stage in range(1, 5):
        ids = {int(k.split(".")[1]) for k in sd if k.startswith(f"layer{stage}.")}
        blocks.append(max(ids) + 1 if ids else 0)
    bottleneck = any(k.endswith("conv3.weight") for k in sd)
    arch = _DEPTHS.get((*blocks, bottleneck))
    if arch is None:
        raise CheckpointError(
            f"weights do not match a torchvision ResNet (blocks per stage {blocks}, "
            f"bottleneck={bottleneck}); is there a backbone in this checkpoint?"
        )
    return arch


def extract_backbone(obj: dict, path: str = "<state>") -> BackboneWeights:
    """Find the backbone in a loaded checkpoint dict (see the module docstring for layouts)."""
    if isinstance(obj.get("model"), dict) and any(
        k.startswith("encoder_q.backbone.") for k in obj["model"]
    ):
        fmt, (sd, dropped) = "lorac", _split(_tensor_items(obj["model"]), "encoder_q.backbone.")
    elif isinstance(obj.get("state_dict"), dict) and any(
        k.startswith("module.encoder_q.") for k in obj["state_dict"]
    ):
        sd, dropped = _split(_tensor_items(obj["state_dict"]), "module.encoder_q.")
        head = sorted(k for k in sd if k.startswith("fc."))
        sd = {k: v for k, v in sd.items() if not k.startswith("fc.")}
        fmt, dropped = "moco", sorted(dropped + ["module.encoder_q." + k for k in head])
    elif "conv1.weight" in obj and "layer1.0.conv1.weight" in obj:
        sd, dropped = _tensor_items(obj), []
        dropped = sorted(k for k in sd if k.startswith("fc."))
        sd = {k: v for k, v in sd.items() if not k.startswith("fc.")}
        fmt = "torchvision"
    else:
        keys = sorted(obj)[:6]
        raise CheckpointError(
            f"{path}: no ResNet backbone found (expected 'model' with 'encoder_q.backbone.*', "
            f"'state_dict' with 'module.encoder_q.*', or torchvision ResNet keys); top-level keys: "
            f"{keys}"
        )
    try:
        arch = infer_resnet_arch(sd)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    # The stem is read off conv1's kernel: 3x3 is the small stem, anything else is checked
    # against torchvision's 7x7 below.
    conv1 = sd.get("conv1.weight")
    stem = "small" if conv1 is not None and tuple(conv1.shape[-2:]) == (3, 3) else "imagenet"
    reference = _reference_backbone(arch, stem).state_dict()
    expected = set(reference)
    missing, unused = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unused:
        raise CheckpointError(
            f"{path}: backbone keys do not match torchvision {arch}: missing {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unmapped {unused[:10]}"
            f"{' ...' if len(unused) > 10 else ''}"
        )
    bad = [k for k in expected if tuple(sd[k].shape) != tuple(reference[k].shape)]
    if bad:
        raise CheckpointError(
            f"{path}: shape mismatch vs torchvision {arch} for {bad[:5]}: "
            + ", ".join(f"{k} {tuple(sd[k].shape)} != {tuple(reference[k].shape)}" for k in bad[:3])
        )
    return BackboneWeights(dict(sd), arch, fmt, dropped, path, stem)


def load_backbone(path: str) -> BackboneWeights:
    """Read ``path`` with ``weights_only=True`` and return its ResNet backbone."""
    return extract_backbone(load_checkpoint_file(path), path)


def build_torchvision_backbone(weights: BackboneWeights) -> torch.nn.Module:
    """A torchvision ResNet with ``fc = Identity`` holding ``weights`` (loaded strictly)."""
    model = _reference_backbone(weights.arch, weights.stem)
    model.load_state_dict(weights.state_dict, strict=True)
    return model
