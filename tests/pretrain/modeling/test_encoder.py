"""Shapes the encoder's backbone sees, found on the meta device."""

from __future__ import annotations

import pytest

from pretrain.modeling.encoder import strided_convs_on_1px_maps


@pytest.mark.parametrize(
    ("arch", "stem", "size", "expected"),
    [
        # 16 px, ImageNet stem: 8 -> 4 (max-pool) -> 4 -> 2 -> 1 -> layer4's strided conv on 1x1
        ("resnet18", "imagenet", 16, ["layer4.0.conv1"]),
        ("resnet18", "imagenet", 12, ["layer4.0.conv1"]),
        ("resnet18", "imagenet", 17, []),  # 9 -> 5 -> 5 -> 3 -> 2: layer4 sees 2x2
        ("resnet18", "imagenet", 24, []),  # the demo's views
        ("resnet50", "imagenet", 16, ["layer4.0.conv2"]),  # v1.5: the stride is on the 3x3
        ("resnet50", "imagenet", 224, []),
        ("resnet18", "small", 16, []),  # no stride-2 stem: 16 -> 16 -> 8 -> 4 -> 2
        ("resnet18", "imagenet", 8, ["layer3.0.conv1", "layer4.0.conv1"]),
    ],
)
def test_strided_convs_on_1px_maps(arch, stem, size, expected):
    assert strided_convs_on_1px_maps(arch, stem, size) == expected
