"""Batched nuclear norm with an exact, finite gradient, in one torch path for every device.

Why hand-written rather than ``torch.linalg.matrix_norm(x, ord="nuc")``: that runs a full SVD
(``gesdd``) of every (m, n) matrix and back-propagates through it, which is slow for the many
small matrices LORAC needs (one (M, d) matrix per instance, M <= 8, d = 128) and gives NaN/inf
gradients when singular values repeat (identical rows) or vanish. Why not the float32 Gram-matrix
shortcut ``sqrt(eigvalsh(X X^T))``: squaring loses half the mantissa, so small singular values
(and the norm of nearly identical rows) come out wrong by ~1e-4 relative.

Method: the Gram matrix of the short side (m x m, m <= n) is formed and eigendecomposed in
float64, so the singular values are exact to float32 precision, and the gradient is the exact
U V^T of the thin SVD restricted to the non-zero singular values (the minimum-norm subgradient
when the matrix is rank-deficient): U V^T = U diag(1/s) U^T X, from the same decomposition. It is
computed in the forward pass and saved in ``x``'s dtype (instead of a float64 copy of ``x``), so
the backward pass is one multiply.

A matrix holding NaN or inf gives NaN (value and gradient) without a host sync: it is zeroed
before ``eigh`` (which would raise on it) and its results are replaced by NaN with
``torch.where``. Until 2026-11 the CPU ran a numba Jacobi kernel here; it was 2-4x faster than
this path but both are about 0.1 % of a training step, so the dependency was dropped
(``benchmarks/bench_nuclear_norm.py`` reports this path against ``matrix_norm``).
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

# Eigenvalues below this fraction of the largest (times the short side) are treated as zero: in
# float64 the Gram matrix is accurate to ~1e-16 relative, so anything below ~1e-13 is round-off.
_RELATIVE_EIG_TOL = 1e-13


def _decompose(x: torch.Tensor, with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Nuclear norms (...) float64 of ``x`` (..., m, n) and, if ``with_grad``, U V^T like ``x``."""
    transposed = x.shape[-2] > x.shape[-1]
    short = x.detach().mT if transposed else x.detach()  # (..., k, l), k <= l
    x64 = short.to(torch.float64, memory_format=torch.contiguous_format)  # (..., k, l)
    finite = torch.isfinite(x64).flatten(-2).all(-1)  # (...,)
    x64 = torch.where(finite[..., None, None], x64, 0.0)
    gram = x64 @ x64.mT  # (..., k, k)
    if with_grad:
        evals, u = torch.linalg.eigh(gram)  # (..., k) ascending, (..., k, k)
    else:
        evals, u = torch.linalg.eigvalsh(gram), None  # no vectors: ~2x cheaper
    tol = evals[..., -1:].clamp_min(0.0) * (_RELATIVE_EIG_TOL * short.shape[-2])  # (..., 1)
    s = torch.where(evals > tol, evals.clamp_min(0.0).sqrt(), 0.0)  # (..., k)
    values = torch.where(finite, s.sum(-1), float("nan"))
    if u is None:
        return values, None
    # U V^T = U diag(1/s) U^T X on the non-zero singular subspace; the product stays in float64
    # because 1/s amplifies the round-off of X by the condition number.
    inv_s = torch.where(s > 0, s.clamp_min(torch.finfo(s.dtype).tiny).reciprocal(), 0.0)
    uvt = ((u * inv_s.unsqueeze(-2)) @ u.mT) @ x64  # (..., k, l)
    uvt = torch.where(finite[..., None, None], uvt, float("nan")).to(x.dtype)
    return values, (uvt.mT if transposed else uvt)


class _NuclearNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        values, uvt = _decompose(x, with_grad=True)
        ctx.save_for_backward(uvt)
        return values.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (uvt,) = ctx.saved_tensors
        return grad_out[..., None, None] * uvt


def nuclear_norm(x: torch.Tensor) -> torch.Tensor:
    """Sum of singular values of each matrix in ``x``.

    Args:
        x: (..., m, n) floating tensor, any batch shape.

    Returns:
        (...) tensor of nuclear norms in ``x.dtype`` (float16/bfloat16 inputs are computed in
        float64 and returned in float32, so callers under autocast keep the prior in full
        precision). Differentiable once, with gradient U V^T on the non-zero singular subspace.
        A matrix holding NaN or inf gives NaN (no LAPACK error, no host sync).

    Raises:
        ValueError: if ``x`` has fewer than 2 dimensions, is not floating point, or is empty.
    """
    if x.dim() < 2:
        raise ValueError(f"nuclear_norm expects (..., m, n), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"nuclear_norm expects a floating tensor, got {x.dtype}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"nuclear_norm got an empty matrix shape {tuple(x.shape)}")
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if torch.is_grad_enabled() and x.requires_grad:
        return _NuclearNorm.apply(x)
    return _decompose(x, with_grad=False)[0].to(x.dtype)
