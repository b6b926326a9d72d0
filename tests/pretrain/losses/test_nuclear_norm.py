"""nuclear_norm against float64 SVD, analytic rank-deficient cases, and gradcheck.

One torch path (float64 Gram + ``eigh``) serves every device; the CPU runs the same ops as CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pretrain.losses import nuclear_norm


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
    (70, 8, 32),
    (33, 7, 40),
    (5, 11, 30),  # more than 8 rows
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


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1e8, 1e30])
def test_extreme_scales_float64(scale: float) -> None:
    """The float64 Gram matrix neither underflows nor overflows here: values stay exact."""
    x = _randn(40, 8, 16, seed=13, dtype=torch.float64) * scale
    value, grad = value_and_grad(x)
    ref_value, ref_grad = reference(x)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


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


def test_non_finite_input_gives_nan_per_matrix() -> None:
    """A matrix holding NaN or inf gives NaN (value and gradient); the other matrices are exact."""
    x = torch.randn(4, 3, 8, requires_grad=True)
    bad = x.detach().clone()
    bad[1, 0, 0] = float("nan")
    bad[2, 1, 1] = float("inf")
    bad.requires_grad_()
    out = nuclear_norm(bad)
    assert out.shape == (4,) and torch.isnan(out[1:3]).all()
    out.sum().backward()
    assert bad.grad is not None and torch.isnan(bad.grad[1:3]).all()
    torch.testing.assert_close(out[[0, 3]].double(), reference(x.detach()[[0, 3]])[0])
    _, ref_grad = reference(x.detach()[[0, 3]])
    torch.testing.assert_close(bad.grad[[0, 3]].double(), ref_grad, rtol=0, atol=1e-6)


class _HostReads(TorchDispatchMode):
    """Counts ops that make a GPU wait for the host: reading a value or a data-dependent shape."""

    SYNCING = {
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.is_nonzero.default",
    }

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += str(func) in self.SYNCING
        return func(*args, **(kwargs or {}))


def test_no_host_sync_forward_or_backward() -> None:
    """The finiteness handling is device-side: no op that reads a value back to the host."""
    x = torch.randn(6, 5, 32, requires_grad=True)
    with _HostReads() as mode:
        nuclear_norm(x).sum().backward()
        with torch.no_grad():
            nuclear_norm(x)
    assert mode.count == 0
    with _HostReads() as mode:
        bool(torch.isfinite(x).all())  # the counter sees a sync when there is one
    assert mode.count == 1
