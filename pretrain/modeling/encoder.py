"""Query/key encoders: a torchvision ResNet (fc removed) and the MLP projection head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

__all__ = ["Encoder", "convert_norm", "resnet_backbone"]


def resnet_backbone(arch: str) -> tuple[nn.Module, int]:
    """A randomly initialised torchvision ResNet without its classifier, and its feature dim."""
    if not arch.startswith("resnet") or not hasattr(torchvision.models, arch):
        raise ValueError(f"MODEL.ARCH = {arch!r}: expected a torchvision ResNet (e.g. resnet50)")
    net = getattr(torchvision.models, arch)(weights=None)
    dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, dim


class Encoder(nn.Module):
    """x -> L2-normalised MLP(backbone(x)); the MLP is Linear-ReLU-Linear (paper Sec. 5)."""

    def __init__(self, arch: str, hidden_dim: int, out_dim: int):
        super().__init__()
        self.backbone, feat_dim = resnet_backbone(arch)
        self.head = nn.Sequential(
            nn.Linear(feat_dim, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x)), dim=1)


def convert_norm(module: nn.Module, norm: str) -> nn.Module:
    """Replace BatchNorm layers by ``SyncBN`` (torch) or ``NaiveSyncBN`` (detectron2).

    NaiveSyncBN exists because torch's SyncBatchNorm refuses CPU tensors with >1 process.
    """
    if norm == "BN":
        return module
    if norm == "SyncBN":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if norm != "NaiveSyncBN":
        raise ValueError(f"MODEL.NORM = {norm!r}: expected BN, SyncBN or NaiveSyncBN")
    from detectron2.layers import NaiveSyncBatchNorm

    def _convert(m: nn.Module) -> nn.Module:
        if isinstance(m, nn.BatchNorm2d):
            new = NaiveSyncBatchNorm(m.num_features, eps=m.eps, momentum=m.momentum)
            new.load_state_dict(m.state_dict())
            return new
        for name, child in m.named_children():
            setattr(m, name, _convert(child))
        return m

    return _convert(module)
