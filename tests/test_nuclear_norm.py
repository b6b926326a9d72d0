"""nuclear_norm against float64 SVD, analytic rank-deficient cases, and gradcheck.

Every check of values and gradients runs on both CPU backends (the numba Jacobi kernel and the
LAPACK fallback) through the ``backend`` fixture.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pretrain import _jacobi
from pretrain.nuclear_norm import (
    CPU_BACKENDS,
    _block_numba,
    _block_numpy,
    _block_torch,
    cpu_backend,
    nuclear_norm,
)


@pytest.fixture(params=CPU_BACKENDS, autouse=True)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("LORAC_NUCLEAR_NORM_CPU", request.param)
    assert cpu_backend() == request.param
    return request.param


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def reference(x: torch.Tensor, rel_tol: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """Nuclear norm and its minimum-norm (sub)gradient U V^T from a float64 SVD.

    Singular values below ``rel_tol`` times the largest count as zero and are left out of U V^T.
    """
    u, s, vh = torch.linalg.svd(x.double(), full_matrices=False)
    keep = (s > rel_tol * s[..., :1]).double()  # (..., k)
    return s.sum(-1), (u * keep.unsqueeze(-2)) @ vh


def value_and_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    value = nuclear_norm(x)
    (grad,) = torch.autograd.grad(value.sum(), x)
    return value, grad


SHAPES = [
    (6, 5, 128),  # LORAC: (N, M, d)
    (70, 8, 32),  # over the threading cut-off (split only with threads > 1: see below)
    (33, 7, 40),  # one matrix past a group of 32 Jacobi lanes
    (5, 11, 30),  # more than 8 rows: the kernel's P X sums in two passes of 8
    (2, 3, 4, 9),  # two batch dims
    (7, 12),  # a single matrix
    (3, 9, 4),  # m > n: computed on the transpose
    (4, 1, 6),  # a single row
    (5, 6, 1),  # a single column
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_rank_matches_float64_svd(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _randn(*shape, seed=sum(shape), dtype=dtype)
    value, grad = value_and_grad(x)
    ref_value, ref_grad = reference(x)
    assert value.dtype == grad.dtype == dtype and value.shape == shape[:-2]
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(value.double(), ref_value, rtol=tol, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=10 * tol)


def test_threaded_split_matches_single_thread() -> None:
    """The CPU batch split across threads gives the same numbers as one thread."""
    x = _randn(200, 8, 64, seed=3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        v1, g1 = value_and_grad(x)
        torch.set_num_threads(3)
        v3, g3 = value_and_grad(x)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(v3, v1, rtol=1e-7, atol=0)
    torch.testing.assert_close(g3, g1, rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_paths_agree(dtype: torch.dtype) -> None:
    """The all-torch steps that CUDA runs, the numpy/LAPACK steps and the numba kernel give the
    same numbers, including rank deficiency (rows 0 and 1 equal) and a strided input."""
    x = _randn(9, 64, 6, seed=12, dtype=dtype).mT  # (9, 6, 64), not contiguous
    x[:, 1] = x[:, 0]
    uvts = {name: torch.empty(x.shape, dtype=dtype) for name in ("numpy", "torch", "numba")}
    values = {
        "numpy": _block_numpy(x, uvts["numpy"]),
        "torch": _block_torch(x, uvts["torch"]),
        "numba": _block_numba(x, uvts["numba"]),
    }
    ref_value, ref_grad = reference(x, rel_tol=1e-5)
    for name in ("torch", "numba"):
        torch.testing.assert_close(values[name], values["numpy"], rtol=1e-12, atol=0)
        torch.testing.assert_close(uvts[name], uvts["numpy"], rtol=0, atol=1e-6)
        torch.testing.assert_close(values[name], ref_value, rtol=1e-10, atol=0)
        torch.testing.assert_close(uvts[name].double(), ref_grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1e8, 1e30])
def test_kernel_extreme_scales_float64(scale: float) -> None:
    """The kernel scales each matrix before rotating: tiny and huge inputs stay exact."""
    x = _randn(40, 8, 16, seed=13, dtype=torch.float64) * scale
    value, grad = value_and_grad(x)
    ref_value, ref_grad = reference(x)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


def test_kernel_converges_in_few_sweeps() -> None:
    """Jacobi's quadratic convergence: a handful of sweeps per group of 32 matrices, also for
    repeated and zero eigenvalues, never the MAX_SWEEPS safeguard."""
    full = _randn(64, 8, 128, seed=14).numpy()
    repeated = np.repeat(_randn(64, 2, 128, seed=15).numpy(), 4, axis=1)  # rank 2, doubled rows
    for x in (full, repeated, np.zeros((64, 8, 128), np.float32)):
        uvt, norms = np.empty_like(x), np.empty(64)
        sweeps = _jacobi.nuclear_norm_kernel(x, uvt, norms, True, 8e-13)
        assert 0 <= sweeps <= 2 * 8  # two groups of 32, at most 8 sweeps each
        assert np.isfinite(norms).all() and np.isfinite(uvt).all()


@pytest.mark.parametrize("m", [2, 5, 8])
def test_identical_rows(m: int) -> None:
    """m copies of r: value sqrt(m) ||r||, minimum-norm subgradient 1/sqrt(m) * r/||r|| per row."""
    r = _randn(4, 1, 128, seed=m)
    x = r.expand(4, m, 128).contiguous()
    value, grad = value_and_grad(x)
    norm = r.double().norm(dim=-1)  # (4, 1)
    torch.testing.assert_close(value.double(), math.sqrt(m) * norm[:, 0], rtol=1e-6, atol=0)
    assert torch.isfinite(grad).all()
    expected = (r.double() / (math.sqrt(m) * norm.unsqueeze(-1))).expand(4, m, 128)
    torch.testing.assert_close(grad.double(), expected, rtol=0, atol=1e-6)


def test_zero_matrix() -> None:
    x = torch.zeros(3, 8, 128)
    value, grad = value_and_grad(x)
    assert (value == 0).all()
    assert torch.isfinite(grad).all() and (grad == 0).all()


@pytest.mark.parametrize("transpose", [False, True])
def test_exact_rank_two(transpose: bool) -> None:
    """8 rows spanning a 2-D space: value and U V^T of the two non-zero singular values."""
    x = _randn(5, 8, 2, seed=1, dtype=torch.float64) @ _randn(
        5, 2, 128, seed=2, dtype=torch.float64
    )
    x = x.float()
    if transpose:
        x = x.mT
    value, grad = value_and_grad(x)
    ref_value, ref_grad = reference(x, rel_tol=1e-5)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(value.double(), ref_value, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=1e-5)
    # Zero singular values contribute nothing: the gradient itself has rank 2.
    assert (torch.linalg.svdvals(grad.double())[..., 2] < 1e-5).all()


def test_nearly_identical_rows_beat_float32_gram() -> None:
    """Rows r + 1e-3 noise: float32 to ~1e-7 relative, where sqrt(eigvalsh(X X^T)) is off ~1e-4."""
    r = _randn(16, 1, 128, seed=4)
    x = r + 1e-3 * _randn(16, 6, 128, seed=5)
    ref_value, ref_grad = reference(x)
    shortcut = torch.linalg.eigvalsh(x @ x.mT).clamp_min(0).sqrt().sum(-1)
    value, grad = value_and_grad(x)
    tol = {"rtol": 1e-6, "atol": 0}
    with pytest.raises(AssertionError):
        torch.testing.assert_close(shortcut.double(), ref_value, **tol)
    torch.testing.assert_close(value.double(), ref_value, **tol)
    # Gradient components along singular values ~1e-3 of the largest are still exact.
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=1e-5)


def test_gradcheck_float64() -> None:
    x = _randn(3, 4, 6, seed=6, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(nuclear_norm, (x,))
    xt = _randn(2, 5, 3, seed=7, dtype=torch.float64).requires_grad_(True)  # m > n
    assert torch.autograd.gradcheck(nuclear_norm, (xt,))


def test_upstream_gradient_is_applied_per_matrix() -> None:
    x = _randn(4, 3, 10, seed=8).requires_grad_(True)
    weights = torch.tensor([1.0, -2.0, 0.5, 0.0])
    (grad,) = torch.autograd.grad((nuclear_norm(x) * weights).sum(), x)
    _, ref_grad = reference(x.detach())
    torch.testing.assert_close(grad.double(), weights.double()[:, None, None] * ref_grad)


def test_no_grad_and_non_contiguous_input() -> None:
    """Values without autograd (eigenvalues only) and from a strided view equal the graph path."""
    base = _randn(10, 128, 6, seed=9)
    x = base.transpose(-1, -2)  # (10, 6, 128), not contiguous, as LORAC builds its (N, M, d)
    with torch.no_grad():
        plain = nuclear_norm(x)
    value, _ = value_and_grad(x)
    torch.testing.assert_close(plain, value, rtol=1e-7, atol=0)
    torch.testing.assert_close(value.double(), reference(x)[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_input_returns_float32(dtype: torch.dtype) -> None:
    x = _randn(4, 5, 32, seed=10).to(dtype).requires_grad_(True)
    value = nuclear_norm(x)
    assert value.dtype == torch.float32 and torch.isfinite(value).all()
    torch.testing.assert_close(value.double(), reference(x.detach())[0], rtol=1e-6, atol=0)
    value.sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_double_backward_is_refused() -> None:
    x = _randn(2, 3, 5, seed=11, dtype=torch.float64).requires_grad_(True)
    (grad,) = torch.autograd.grad(nuclear_norm(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.ones(5), "expects \\(..., m, n\\)"),
        (torch.ones(2, 3, dtype=torch.int64), "floating tensor"),
        (torch.ones(4, 0, 3), "empty matrix"),
        (torch.ones(4, 3, 0), "empty matrix"),
    ],
)
def test_bad_input_raises(x: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nuclear_norm(x)


def test_non_finite_input_gives_nan_not_a_lapack_error(backend: str) -> None:
    x = torch.randn(4, 3, 8, requires_grad=True)
    bad = x.detach().clone()
    bad[1, 0, 0] = float("nan")
    bad[2, 1, 1] = float("inf")
    bad.requires_grad_()
    out = nuclear_norm(bad)
    assert out.shape == (4,) and torch.isnan(out[1:3]).all()
    out.sum().backward()
    assert bad.grad is not None and torch.isnan(bad.grad[1:3]).all()
    if backend == "numba":  # per matrix: the others are untouched (LAPACK's path: all NaN)
        torch.testing.assert_close(out[[0, 3]].double(), reference(x.detach()[[0, 3]])[0])


def test_unknown_backend_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAC_NUCLEAR_NORM_CPU", "magma")
    with pytest.raises(ValueError, match="LORAC_NUCLEAR_NORM_CPU='magma'"):
        nuclear_norm(torch.ones(2, 3, 4))


def test_without_numba_falls_back_to_lapack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where numba cannot be imported, a warning names the slower path and results are the same."""
    import sys

    from pretrain import nuclear_norm as module

    monkeypatch.delenv("LORAC_NUCLEAR_NORM_CPU")
    monkeypatch.setitem(sys.modules, "pretrain._jacobi", None)  # import raises ImportError
    module._numba_kernel.cache_clear()
    try:
        with pytest.warns(UserWarning, match="numba unavailable"):
            assert cpu_backend() == "lapack"
        x = _randn(6, 5, 32, seed=16)
        torch.testing.assert_close(
            value_and_grad(x)[0].double(), reference(x)[0], rtol=1e-6, atol=0
        )
    finally:
        module._numba_kernel.cache_clear()
