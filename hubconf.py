"""torch.hub entry points: torchvision ResNets holding this project's (or any readable) weights.

    model = torch.hub.load("/path/to/lorac", "lorac_resnet50", source="local", weights="r50.pth")
    features = model(images)  # (N, 2048): pooled backbone features, no classifier

``weights`` is a file ``tools/export_backbone.py`` wrote (``.pth`` or ``.safetensors``; torch and
torchvision suffice to read it, plus safetensors for the latter), or any checkpoint the project's
reader knows (docs/checkpoints.md; that path imports the repository's packages, so it needs the
project's requirements). Without ``weights`` the network is randomly initialised.
"""

from __future__ import annotations

import os

import torch
import torchvision

dependencies = ["torch", "torchvision"]

__all__ = ["lorac_resnet18", "lorac_resnet50"]


def _read_export(path: str) -> dict | None:
    """The state dict of an exported file, or ``None`` if ``path`` is not a plain state dict."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            obj = load_file(path)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - the project's reader gives the one-line error
        return None
    if isinstance(obj, dict) and obj and all(torch.is_tensor(v) for v in obj.values()):
        return obj
    return None


def _resnet(arch: str, weights: str | os.PathLike | None) -> torchvision.models.ResNet:
    model = torchvision.models.__dict__[arch](weights=None)
    model.fc = torch.nn.Identity()
    if weights is None:
        return model
    path = os.fspath(weights)
    expected = set(model.state_dict())
    state = _read_export(path)
    if state is None or set(state) != expected:
        # Not a plain export of this architecture: the project's reader (any layout), which
        # refuses with one line naming the file and keys.
        from transfer.export.backbone import ExportError, export_state_dict, read_backbone

        backbone, _ = read_backbone(path)
        if backbone.arch != arch:
            raise ExportError(
                f"{path}: a {backbone.arch} backbone; load it with lorac_{backbone.arch}, not "
                f"lorac_{arch}"
            )
        state = export_state_dict(backbone, "torchvision")
    model.load_state_dict(state, strict=True)
    return model


def lorac_resnet50(weights: str | os.PathLike | None = None) -> torchvision.models.ResNet:
    """torchvision ResNet-50 with ``fc = nn.Identity()``: ``model(x)`` gives the (N, 2048)
    average-pooled features that the pretraining's kNN and linear probes read.

    Args:
        weights: an exported backbone (``tools/export_backbone.py``) or any checkpoint listed in
            docs/checkpoints.md; ``None`` for random initialisation.
    """
    return _resnet("resnet50", weights)


def lorac_resnet18(weights: str | os.PathLike | None = None) -> torchvision.models.ResNet:
    """torchvision ResNet-18 with ``fc = nn.Identity()``: (N, 512) pooled features; ``weights``
    as for :func:`lorac_resnet50` (the demo's checkpoints are ResNet-18s)."""
    return _resnet("resnet18", weights)
