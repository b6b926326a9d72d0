"""nuclear_norm forward+backward vs torch.linalg.matrix_norm(ord="nuc"), in one process.

Reports the ratio baseline_time / ours (higher is better). ``--breakdown`` also times the parts:
the forward pass with a graph, the value alone (no graph) and the float64 LAPACK
eigendecomposition of the same Gram matrices alone, which bounds our path from below.
Run: .venv/bin/python -m benchmarks.bench_nuclear_norm [--breakdown]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import interleaved_timings
from pretrain.losses import nuclear_norm


def bench_shape(shape: tuple[int, ...], breakdown: bool) -> None:
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
    if not breakdown:
        return
    gram = x.detach().double() @ x.detach().double().mT  # (N, m, m)

    def value_only() -> None:
        with torch.no_grad():
            nuclear_norm(x)

    parts = {
        "fwd+bwd": ours,
        "fwd": lambda: nuclear_norm(x),
        "value_only": value_only,
        "eigh": lambda: torch.linalg.eigh(gram),
        "eigvalsh": lambda: torch.linalg.eigvalsh(gram),
    }
    t = interleaved_timings(parts, repeats=15)
    print("  " + " ".join(f"{k}={v * 1e3:.2f}ms" for k, v in t.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", action="store_true", help="also time the parts")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()}")
    for shape in [(256, 5, 128), (256, 8, 128)]:
        bench_shape(shape, args.breakdown)


if __name__ == "__main__":
    main()
