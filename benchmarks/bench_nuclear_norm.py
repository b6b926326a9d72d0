"""nuclear_norm forward+backward, both eigensolvers, vs torch.linalg.matrix_norm(ord="nuc").

Reports, in one process on the CPU, the time of ``method="eigh"`` (what the CPU runs under
"auto") and ``method="jacobi"`` (the sync-free path a GPU runs) at LORAC's shapes, and the ratio
matrix_norm / ours (higher is better). ``--breakdown`` also times the parts: the forward pass
with a graph, the value alone (no graph) and the float64 eigendecomposition of the same Gram
matrices alone. ``--sides`` times both methods against the short side k (the reason for
``JACOBI_AUTO_MAX_SIDE``). ``--sweeps`` measures how many Jacobi sweeps the worst spectra need
(the reason for ``jacobi_sweeps``): the first count after which value and gradient are as close
to a float64 SVD as with three times the sweeps (or as eigh, if that is farther).
Run: .venv/bin/python -m benchmarks.bench_nuclear_norm [--breakdown] [--sides] [--sweeps]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from common import interleaved_timings
from pretrain.losses import nuclear
from pretrain.losses.nuclear import jacobi_eigh, jacobi_sweeps, nuclear_norm

# (N, M, d): LORAC's Q at IN-1K multi-crop (M = 5) at 256 and 32 images, and M = 8
SHAPES = [(256, 5, 128), (32, 5, 128), (256, 8, 128), (32, 8, 128)]
SIDES = [2, 4, 5, 8, 12, 16, 24, 32]


def bench_shape(shape: tuple[int, ...], breakdown: bool) -> None:
    x = torch.randn(*shape, requires_grad=True)

    def run(method: str):  # noqa: ANN202
        return lambda: nuclear_norm(x, method).sum().backward()

    def baseline() -> None:
        torch.linalg.matrix_norm(x, ord="nuc").sum().backward()

    fns = {"matrix_norm": baseline, "eigh": run("eigh"), "jacobi": run("jacobi")}
    t = interleaved_timings(fns, repeats=15)
    print(
        f"shape={shape} matrix_norm={t['matrix_norm'] * 1e3:.2f}ms "
        f"eigh={t['eigh'] * 1e3:.2f}ms ({t['matrix_norm'] / t['eigh']:.1f}x) "
        f"jacobi={t['jacobi'] * 1e3:.2f}ms ({t['matrix_norm'] / t['jacobi']:.1f}x, "
        f"{jacobi_sweeps(shape[-2])} sweeps)"
    )
    if not breakdown:
        return
    gram = x.detach().double() @ x.detach().double().mT  # (N, m, m)

    def value_only(method: str):  # noqa: ANN202
        def fn() -> None:
            with torch.no_grad():
                nuclear_norm(x, method)

        return fn

    for method, eig in [("eigh", torch.linalg.eigh), ("jacobi", jacobi_eigh)]:
        parts = {
            "fwd+bwd": run(method),
            "fwd": lambda m=method: nuclear_norm(x, m),
            "value_only": value_only(method),
            "eig": lambda e=eig: e(gram),
        }
        t = interleaved_timings(parts, repeats=15)
        print(f"  {method}: " + " ".join(f"{k}={v * 1e3:.2f}ms" for k, v in t.items()))


def bench_sides(batch: int = 64) -> None:
    """Both methods (forward + backward) against k at (batch, k, 128), few repeats: Jacobi's
    cost grows like its rounds (sweeps x (k' - 1), each O(k^2) per matrix), eigh's far slower."""
    print(f"short side k at ({batch}, k, 128), forward + backward:")
    for k in SIDES:
        x = torch.randn(batch, k, 128, requires_grad=True)
        fns = {m: lambda m=m, x=x: nuclear_norm(x, m).sum().backward() for m in ("eigh", "jacobi")}
        t = interleaved_timings(fns, repeats=3, inner=1, warmup=1)
        rounds = jacobi_sweeps(k) * (k + k % 2 - 1)
        print(
            f"  k={k:2d} eigh={t['eigh'] * 1e3:8.2f}ms jacobi={t['jacobi'] * 1e3:9.2f}ms "
            f"ratio={t['jacobi'] / t['eigh']:6.1f} sweeps={jacobi_sweeps(k)} rounds={rounds}"
        )


def spectra(k: int, batch: int, seed: int) -> dict[str, torch.Tensor]:
    """(batch, k, 128) float64 matrices whose Gram matrices are hard for Jacobi: random, nearly
    identical rows, rank-deficient, graded rows, and prescribed singular values (repeated,
    clustered, geometric, near pairs)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def with_s(s: list[float]) -> torch.Tensor:
        u, _ = torch.linalg.qr(randn(batch, k, k))
        v, _ = torch.linalg.qr(randn(batch, 128, k))
        return (u * torch.tensor(s[:k], dtype=torch.float64)) @ v.mT

    half, rows = max(k // 2, 1), randn(batch, 1, 128)
    graded = torch.logspace(0, -5, k, dtype=torch.float64)[:, None]
    cases = {
        "gauss": randn(batch, k, 128),
        "square": randn(batch, k, k),
        "unit_rows": torch.nn.functional.normalize(randn(batch, k, 128), dim=-1),
        "graded": randn(batch, k, 128) * graded,
        "graded_reversed": randn(batch, k, 128) * graded.flip(0),
    }
    for noise in (1e-2, 1e-3, 1e-5):
        cases[f"near_rows_{noise}"] = (rows + noise * randn(batch, k, 128)).float().double()
    for rank in sorted({1, 2, half, max(k - 1, 1)}):
        cases[f"rank_{rank}"] = randn(batch, k, rank) @ randn(batch, rank, 128)
    cases["s_equal"] = with_s([1.0] * k)
    cases["s_two_clusters"] = with_s([1.0] * half + [1e-4] * k)
    near = [1.0 + 1e-9 * i for i in range(half)] + [1e-3 * (1 + 1e-8 * i) for i in range(k)]
    cases["s_two_clusters_near"] = with_s(near)
    cases["s_geometric"] = with_s(torch.logspace(0, -5.5, k).tolist())
    cases["s_near_pairs"] = with_s([1.0, 1.0 + 1e-10, 0.3, 0.3 * (1 + 1e-12)] + [0.1] * k)
    cases["s_zero_and_equal"] = with_s([1.0] * half + [0.0] * k)
    return cases


def _errors(x: torch.Tensor, method: str, sweeps: int | None = None) -> tuple[float, float]:
    """Largest relative value error and absolute gradient error against a float64 SVD."""
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    keep = (s > 1e-6 * s[..., :1]).double()
    ref_value, ref_grad = s.sum(-1), (u * keep.unsqueeze(-2)) @ vh
    leaf = x.clone().requires_grad_(True)
    count = jacobi_sweeps if sweeps is None else (lambda k: sweeps)
    with mock.patch.object(nuclear, "jacobi_sweeps", count):
        value = nuclear_norm(leaf, method)
        (grad,) = torch.autograd.grad(value.sum(), leaf)
    value_error = ((value.detach() - ref_value) / ref_value).abs().max().item()
    return value_error, (grad - ref_grad).abs().max().item()


def sweeps_needed(x: torch.Tensor, most: int) -> int:
    """The first sweep count whose errors are within 2x of the converged ones (``most`` sweeps)
    or of eigh's, whichever is larger (and at least 1e-14 / 1e-13)."""
    final, eigh = _errors(x, "jacobi", most), _errors(x, "eigh")
    value_tol = max(2 * final[0], 2 * eigh[0], 1e-14)
    grad_tol = max(2 * final[1], 2 * eigh[1], 1e-13)
    for sweeps in range(most + 1):
        value_error, grad_error = _errors(x, "jacobi", sweeps)
        if value_error <= value_tol and grad_error <= grad_tol:
            return sweeps
    return most


def bench_sweeps(sides: list[int], seeds: int = 3) -> None:
    print("Jacobi sweeps needed on the worst spectra (batch 100 per case and seed):")
    for k in sides:
        worst, where = 0, ""
        for seed in range(seeds):
            for name, x in spectra(k, 100, seed).items():
                need = sweeps_needed(x, 3 * jacobi_sweeps(k))
                if need > worst:
                    worst, where = need, f"{name}, seed {seed}"
        print(f"  k={k:2d} worst={worst:2d} ({where}) jacobi_sweeps={jacobi_sweeps(k)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", action="store_true", help="also time the parts")
    parser.add_argument("--sides", action="store_true", help="time both methods against k")
    parser.add_argument(
        "--sweeps", type=int, nargs="*", metavar="K", help="sweeps needed for these k (3..8)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()}")
    if args.sweeps is not None:
        bench_sweeps(args.sweeps or list(range(3, 9)))
        return
    for shape in SHAPES:
        bench_shape(shape, args.breakdown)
    if args.sides:
        bench_sides()


if __name__ == "__main__":
    main()
