"""Is this build's CPU bfloat16 conv weight gradient right where a strided 3x3 conv sees 1x1 maps?

A 3x3 stride-2 conv (padding 1) on a 1x1 input only ever multiplies its centre tap with data;
the other taps see padding, so their weight gradient is exactly 0. Under CPU bfloat16 autocast
torch 2.14.1 (oneDNN 3.12, AVX512-BF16 CPU) leaves leftover memory there (sometimes NaN) in
about half of the calls; float32 and float16 give exact zeros. ``PretrainTrainer`` refuses such
runs (``pretrain.engine.launch.check_cpu_bfloat16``); this script shows the fault on a build.

Run: .venv/bin/python -m benchmarks.check_bf16_conv [--trials 40]
"""

from __future__ import annotations

import argparse
import re

import torch


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


def _onednn_version() -> str:
    found = re.search(r"MKL-DNN v([\d.]+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, oneDNN {_onednn_version()}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    for dtype in (None, torch.float16, torch.bfloat16):
        for channels_last in (False, True):
            faults, bad = padding_tap_faults(dtype, channels_last, trials=args.trials)
            name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
            print(
                f"{name:9s} channels_last={channels_last!s:5s}: non-zero padding-tap weight "
                f"gradient in {faults}/{args.trials} calls ({bad} non-finite)"
            )


if __name__ == "__main__":
    main()
