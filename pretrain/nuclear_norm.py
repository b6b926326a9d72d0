"""Batched nuclear norm with an exact, finite gradient.

Why not ``torch.linalg.matrix_norm(x, ord="nuc")``: it runs a full SVD of every (m, n) matrix and
back-propagates through it, which is slow for the many small matrices LORAC needs (one (M, d)
matrix per instance, M <= 8, d = 128) and gives NaN/inf gradients when singular values repeat
(identical rows) or vanish. Why not the float32 Gram-matrix shortcut ``sqrt(eig(X X^T))``: squaring
loses half the mantissa, so small singular values (and the norm of nearly identical rows) come out
wrong by ~1e-4 relative.

Here the Gram matrix is formed and eigendecomposed in float64 on the short side (m x m, m <= n), so
singular values are exact to float32 precision, and the gradient is the exact U V^T of the thin SVD
restricted to the non-zero singular values (the minimum-norm subgradient when the matrix is
rank-deficient): U V^T = U diag(1/s) U^T X, computed from the same decomposition.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import torch

# Eigenvalues below this fraction of the largest (times the short side) are treated as zero: in
# float64 the Gram matrix is accurate to ~1e-16 relative, so anything below ~1e-13 is round-off.
_RELATIVE_EIG_TOL = 1e-13


@functools.lru_cache(maxsize=1)
def _executor(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nuclear_norm")


def _eigh(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched eigh that uses every intra-op thread on CPU.

    Why: torch runs a batch of small eigh problems as a serial loop of LAPACK calls (~4 us per
    8x8 matrix, the dominant cost of LORAC's prior). The ops release the GIL, so splitting the
    batch across threads gives a near-linear speed-up on CPU; CUDA batches are left alone.
    """
    threads = torch.get_num_threads()
    batch = gram.reshape(-1, *gram.shape[-2:])
    if gram.device.type != "cpu" or threads < 2 or batch.shape[0] < 64:
        return torch.linalg.eigh(gram)
    chunks = batch.chunk(threads)
    futures = [_executor(threads - 1).submit(torch.linalg.eigh, c) for c in chunks[1:]]
    results = [torch.linalg.eigh(chunks[0])] + [f.result() for f in futures]
    evals = torch.cat([r[0] for r in results]).reshape(gram.shape[:-1])
    evecs = torch.cat([r[1] for r in results]).reshape(gram.shape)
    return evals, evecs


def _eigh_gram(x64: torch.Tensor, vectors: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eigen-decomposition of the float64 Gram matrix of x64 (..., m, n), m <= n.

    Returns (singular values with round-off eigenvalues zeroed, eigenvectors U or None)."""
    gram = x64 @ x64.transpose(-1, -2)  # (..., m, m)
    if vectors:
        evals, evecs = _eigh(gram)  # ascending
    else:
        evals, evecs = torch.linalg.eigvalsh(gram), None
    tol = evals[..., -1:].clamp_min(0.0) * (_RELATIVE_EIG_TOL * x64.shape[-2])
    s = torch.where(evals > tol, evals.clamp_min(0.0).sqrt(), torch.zeros_like(evals))
    return s, evecs


class _NuclearNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        transposed = x.shape[-2] > x.shape[-1]
        x64 = x.detach().to(torch.float64)
        if transposed:
            x64 = x64.transpose(-1, -2)
        need_grad = ctx.needs_input_grad[0]
        s, u = _eigh_gram(x64, vectors=need_grad)
        if need_grad:
            ctx.save_for_backward(x64, u, s)
        ctx.transposed = transposed
        return s.sum(-1).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x64, u, s = ctx.saved_tensors
        # d||X||_*/dX = U V^T = U diag(1/s) U^T X on the non-zero singular subspace; the upstream
        # gradient is folded into the (m, m) factor so only one (m, m) @ (m, n) product remains.
        scale = torch.where(s > 0, grad_out.to(torch.float64)[..., None] / s.clamp_min(1e-300), 0)
        proj = (u * scale.unsqueeze(-2)) @ u.transpose(-1, -2)  # (..., m, m)
        grad = (proj @ x64).to(grad_out.dtype)  # (..., m, n)
        return grad.transpose(-1, -2) if ctx.transposed else grad


def nuclear_norm(x: torch.Tensor) -> torch.Tensor:
    """Sum of singular values of each matrix in ``x``.

    Args:
        x: (..., m, n) floating tensor, any batch shape.

    Returns:
        (...) tensor of nuclear norms in ``x.dtype`` (float16/bfloat16 inputs are computed in
        float64 and returned in float32, so callers under autocast keep the prior in full
        precision).

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
    return _NuclearNorm.apply(x)
