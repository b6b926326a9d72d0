"""Query/key encoders: a torchvision ResNet (fc removed) and the MLP projection head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from pretrain.config.defaults import NORMS, STEMS
from pretrain.modeling.norm import BatchNorm2d, SyncBatchNorm, convert_batchnorm

__all__ = [
    "STEMS",
    "Encoder",
    "convert_norm",
    "resnet_backbone",
    "set_stem",
    "strided_convs_on_1px_maps",
]

# MODEL.STEM "small": a 3x3 stride-1 conv and no max-pool, as SimCLR and solo-learn use for
# 32 px images (a 28 px input keeps 4x4 in the last stage, not 1x1); the module names stay
# torchvision's, so the state dict differs only in conv1.weight's kernel.


def set_stem(net: nn.Module, stem: str) -> nn.Module:
    """Give the torchvision ResNet ``net`` the stem ``stem`` (in place; returns ``net``)."""
    if stem not in STEMS:
        raise ValueError(f"MODEL.STEM = {stem!r}: expected one of {STEMS}")
    if stem == "small":
        out = net.conv1.out_channels
        net.conv1 = nn.Conv2d(3, out, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
    return net


def resnet_backbone(arch: str, stem: str = "imagenet") -> tuple[nn.Module, int]:
    """A randomly initialised torchvision ResNet without its classifier, and its feature dim."""
    if not arch.startswith("resnet") or not hasattr(torchvision.models, arch):
        raise ValueError(f"MODEL.ARCH = {arch!r}: expected a torchvision ResNet (e.g. resnet50)")
    net = set_stem(getattr(torchvision.models, arch)(weights=None), stem)
    dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, dim


def strided_convs_on_1px_maps(arch: str, stem: str, size: int) -> list[str]:
    """Names of the backbone's strided convs wider than 1x1 whose input map is 1 px high or wide
    at ``size`` px images, found on the meta device (shapes only)."""
    with torch.device("meta"):
        net, _ = resnet_backbone(arch, stem)
    net.eval()  # BatchNorm in eval mode accepts a batch of one 1x1 map
    found: list[str] = []

    def watch(name: str):  # noqa: ANN202
        def hook(conv: nn.Conv2d, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
            wide = max(conv.kernel_size) > 1 and max(conv.stride) > 1
            if wide and min(inputs[0].shape[-2:]) == 1:
                found.append(name)

        return hook

    for name, m in net.named_modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(watch(name))
    with torch.no_grad():
        net(torch.empty(1, 3, size, size, device="meta"))
    return found


class Encoder(nn.Module):
    """x -> L2-normalised MLP(backbone(x)); the MLP is Linear-ReLU-Linear (paper Sec. 6.1)."""

    def __init__(self, arch: str, hidden_dim: int, out_dim: int, stem: str = "imagenet") -> None:
        super().__init__()
        self.backbone, feat_dim = resnet_backbone(arch, stem)
        self.head = nn.Sequential(
            nn.Linear(feat_dim, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x)), dim=1)


def convert_norm(module: nn.Module, norm: str) -> nn.Module:
    """Replace BatchNorm layers by ``BN`` or ``SyncBN`` (:mod:`pretrain.modeling.norm`) or
    ``NaiveSyncBN`` (detectron2's)."""
    if norm == "BN":
        return convert_batchnorm(module, BatchNorm2d)
    if norm == "SyncBN":
        return convert_batchnorm(module, SyncBatchNorm)
    if norm != "NaiveSyncBN":
        raise ValueError(f"MODEL.NORM = {norm!r}: expected one of {NORMS[1:]}")
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
