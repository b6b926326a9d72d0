"""nuclear_norm forward+backward vs torch.linalg.matrix_norm(ord="nuc"), in one process.

Reports the ratio baseline_time / ours (higher is better); issue target: >= 5x, aim 10x.
Run: .venv/bin/python benchmarks/bench_nuclear_norm.py
"""

from __future__ import annotations

import torch

from benchmarks.common import interleaved_timings
from pretrain.losses import nuclear_norm


def main() -> None:
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()}")
    for shape in [(256, 5, 128), (256, 8, 128)]:
        x = torch.randn(*shape, requires_grad=True)

        def ours() -> None:
            nuclear_norm(x).sum().backward()

        def baseline() -> None:
            torch.linalg.matrix_norm(x, ord="nuc").sum().backward()

        t = interleaved_timings({"matrix_norm": baseline, "nuclear_norm": ours}, repeats=15)
        ratio = t["matrix_norm"] / t["nuclear_norm"]
        print(
            f"shape={shape} matrix_norm={t['matrix_norm'] * 1e3:.2f}ms "
            f"nuclear_norm={t['nuclear_norm'] * 1e3:.2f}ms speedup={ratio:.1f}x"
        )


if __name__ == "__main__":
    main()
