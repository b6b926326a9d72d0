"""Is this build's CPU bfloat16 conv weight gradient right where a strided 3x3 conv sees 1x1 maps?

Counts the faults :func:`pretrain.diagnostics.cpu_bfloat16.padding_tap_faults` finds for float32,
float16 and bfloat16, NCHW and channels_last.

Run: .venv/bin/python -m benchmarks.check_bf16_conv [--trials 40]
"""

from __future__ import annotations

import argparse
import re

import torch

from pretrain.diagnostics.cpu_bfloat16 import padding_tap_faults


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
