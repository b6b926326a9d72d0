"""torchvision <-> detectron2 names of the same ResNet: one mapping, both directions.

torchvision and detectron2 name the same ResNet differently::

    conv1.weight / bn1.*                      <-> stem.conv1.weight / stem.conv1.norm.*
    layer{i}.{j}.conv{k}.weight / bn{k}.*     <-> res{i+1}.{j}.conv{k}.weight / .conv{k}.norm.*
    layer{i}.{j}.downsample.0.weight / .1.*   <-> res{i+1}.{j}.shortcut.weight / .shortcut.norm.*

This holds for bottleneck (R50/101/152: conv1..conv3) and basic-block (R18/34: conv1, conv2)
ResNets alike, and is the naming that detectron2's ``tools/convert-torchvision-to-d2.py`` and
this project's converter write. It lives in ``pretrain/`` (the bottom layer) because the
checkpoint reader needs the reverse direction and ``transfer/detection/convert.py`` the forward
one. Names only: the stride placement (``MODEL.RESNETS.STRIDE_IN_1X1``) is not in the weights.
"""

from __future__ import annotations

import re

__all__ = ["BN_SUFFIXES", "SEQUENTIAL_CHILDREN", "d2_to_torchvision_name", "torchvision_to_d2_name"]

BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_BN = "|".join(BN_SUFFIXES)

# torchvision -> detectron2
_STEM = {"conv1.weight": "stem.conv1.weight"} | {
    f"bn1.{s}": f"stem.conv1.norm.{s}" for s in BN_SUFFIXES
}
_BLOCK = re.compile(r"^layer([1-4])\.(\d+)\.(.+)$")
_CONV = re.compile(r"^conv([1-3])\.weight$")
_BNK = re.compile(rf"^bn([1-3])\.({_BN})$")
_DOWN = re.compile(rf"^downsample\.(0\.weight|1\.({_BN}))$")

# detectron2 -> torchvision
_STEM_INV = {v: k for k, v in _STEM.items()}
_D2_BLOCK = re.compile(r"^res([2-5])\.(\d+)\.(.+)$")
_D2_CONV = re.compile(r"^conv([1-3])\.weight$")
_D2_NORM = re.compile(rf"^conv([1-3])\.norm\.({_BN})$")
_D2_SHORT = re.compile(rf"^shortcut\.(weight|norm\.({_BN}))$")

# ``nn.Sequential(*list(resnet.children())[:-1])`` (torchvision ResNet without ``fc``) numbers
# its children in torchvision's definition order: conv1, bn1, relu, maxpool, layer1..4, avgpool.
SEQUENTIAL_CHILDREN = {
    "0": "conv1",
    "1": "bn1",
    "4": "layer1",
    "5": "layer2",
    "6": "layer3",
    "7": "layer4",
}


def torchvision_to_d2_name(key: str) -> str | None:
    """detectron2 ResNet name of a torchvision ResNet key, or ``None`` if it has none."""
    if key in _STEM:
        return _STEM[key]
    m = _BLOCK.match(key)
    if m is None:
        return None
    base, rest = f"res{int(m.group(1)) + 1}.{m.group(2)}", m.group(3)
    if c := _CONV.match(rest):
        return f"{base}.conv{c.group(1)}.weight"
    if b := _BNK.match(rest):
        return f"{base}.conv{b.group(1)}.norm.{b.group(2)}"
    if d := _DOWN.match(rest):
        if d.group(2) is None:
            return f"{base}.shortcut.weight"
        return f"{base}.shortcut.norm.{d.group(2)}"
    return None


def d2_to_torchvision_name(key: str) -> str | None:
    """torchvision ResNet name of a detectron2 ResNet key (the inverse), or ``None``."""
    if key in _STEM_INV:
        return _STEM_INV[key]
    m = _D2_BLOCK.match(key)
    if m is None:
        return None
    base, rest = f"layer{int(m.group(1)) - 1}.{m.group(2)}", m.group(3)
    if c := _D2_CONV.match(rest):
        return f"{base}.conv{c.group(1)}.weight"
    if n := _D2_NORM.match(rest):
        return f"{base}.bn{n.group(1)}.{n.group(2)}"
    if s := _D2_SHORT.match(rest):
        if s.group(2) is None:
            return f"{base}.downsample.0.weight"
        return f"{base}.downsample.1.{s.group(2)}"
    return None
