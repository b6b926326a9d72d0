"""The CPU bfloat16 conv fault :func:`pretrain.engine.launch.check_cpu_bfloat16` refuses, counted.

A 3x3 stride-2 conv (padding 1) on a 1x1 input only ever multiplies its centre tap with data;
the other taps see padding, so their weight gradient is exactly 0. Under CPU bfloat16 autocast
torch 2.14.1 (oneDNN 3.12, AVX512-BF16 CPU) leaves leftover memory there (sometimes NaN) in
about half of the calls; float32 and float16 give exact zeros. ``benchmarks/check_bf16_conv.py``
prints the count on a build.
"""

from __future__ import annotations

import torch

__all__ = ["padding_tap_faults"]


def padding_tap_faults(
    dtype: torch.dtype | None, channels_last: bool, trials: int = 40
) -> tuple[int, int]:
    """(calls whose off-centre taps got a non-zero weight gradient, of them non-finite) for
    layer4.0.conv1 of a ResNet-18 (256 -> 512, 3x3, stride 2) on a batch of 40 1x1 maps;
    ``dtype`` None: float32 without autocast."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(256, 512, 3, stride=2, padding=1, bias=False)
    x = torch.randn(40, 256, 1, 1)
    if channels_last:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    faults = non_finite = 0
    for _ in range(trials):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = conv(x)
        y.float().sum().backward()
        grad = conv.weight.grad
        off_centre = grad.clone()
        off_centre[:, :, 1, 1] = 0
        finite = bool(grad.isfinite().all())
        if not finite or off_centre.abs().amax() > 0:
            faults += 1
            non_finite += int(not finite)
        conv.weight.grad = None
    return faults, non_finite
