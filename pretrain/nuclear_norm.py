"""Batched nuclear norm with an exact, finite gradient.

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

CPU backends (``LORAC_NUCLEAR_NORM_CPU`` picks one; default ``numba`` when numba imports):

* ``numba``: ``pretrain._jacobi``, a compiled kernel that does all of the above per matrix in one
  pass, with a Jacobi eigensolver run in SIMD lock-step across 32 matrices. LAPACK's ``syevd``
  costs ~5 us per 8 x 8 Gram matrix, mostly call overhead, and torch loops over the batch serially;
  a batched Jacobi written in torch ops was 12-17x slower still (~35 rounds of ~10 small kernels).
  Compiled on first use (a few seconds per dtype) and cached next to the module.
* ``lapack``: the same steps with numpy products and ``torch.linalg.eigh`` (the fallback where
  numba is unavailable).

The ``lapack`` path splits the batch across the intra-op threads, each running the whole pipeline
on its share (LAPACK and numpy release the GIL); the ``numba`` kernel runs in the calling thread.
"""

from __future__ import annotations

import functools
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch.autograd.function import FunctionCtx, once_differentiable

# Eigenvalues below this fraction of the largest (times the short side) are treated as zero: in
# float64 the Gram matrix is accurate to ~1e-16 relative, so anything below ~1e-13 is round-off.
_RELATIVE_EIG_TOL = 1e-13

CPU_BACKENDS = ("numba", "lapack")
_BACKEND_ENV = "LORAC_NUCLEAR_NORM_CPU"

# Below this many matrices a thread hand-off costs more than it saves.
_MIN_BATCH_TO_SPLIT = 64


@functools.lru_cache(maxsize=4)
def _executor(workers: int, pid: int) -> ThreadPoolExecutor:
    # Keyed by pid: a forked child (a DataLoader worker, say) inherits the pool object but not its
    # threads, and would wait forever on work submitted to it.
    del pid
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nuclear_norm")


# U V^T = U diag(1/s) U^T X on the non-zero singular subspace. Its product stays in float64
# because 1/s amplifies the round-off of X by the condition number. _block_numpy (CPU) and
# _block_torch (other devices) are the same steps: numpy runs them in the calling thread, where
# torch starts an OpenMP team for each op of this size, and on a loaded machine each can wait a
# scheduler slice for its second thread (measured stalls of several ms per op); numpy's small
# float64 products and per-op overheads are also lower than torch's here.


def _block_numpy(x: torch.Tensor, uvt: torch.Tensor | None) -> torch.Tensor:
    """Nuclear norms (b,) float64 of CPU ``x`` (b, m, n), m <= n; writes U V^T into ``uvt``."""
    x64 = np.asarray(x.numpy(), dtype=np.float64, order="C")  # (b, m, n)
    gram = torch.from_numpy(np.matmul(x64, x64.transpose(0, 2, 1)))  # (b, m, m)
    if uvt is None:
        evals, u = torch.linalg.eigvalsh(gram).numpy(), None  # no vectors: ~2x cheaper
    else:
        evals, u = (t.numpy() for t in torch.linalg.eigh(gram))  # (b, m) ascending, (b, m, m)
    tol = np.maximum(evals[:, -1:], 0.0) * (_RELATIVE_EIG_TOL * x.shape[-2])  # (b, 1)
    s = np.where(evals > tol, np.sqrt(np.maximum(evals, 0.0)), 0.0)  # (b, m)
    if uvt is not None:
        inv_s = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
        proj = np.matmul(u * inv_s[:, None, :], u.transpose(0, 2, 1))  # (b, m, m)
        np.copyto(uvt.numpy(), np.matmul(proj, x64))
    return torch.from_numpy(s.sum(-1))


def _block_torch(x: torch.Tensor, uvt: torch.Tensor | None) -> torch.Tensor:
    """_block_numpy in torch ops, for any device."""
    x64 = x.to(torch.float64, memory_format=torch.contiguous_format)  # (b, m, n)
    gram = x64 @ x64.mT  # (b, m, m)
    if uvt is None:
        evals, u = torch.linalg.eigvalsh(gram), None
    else:
        evals, u = torch.linalg.eigh(gram)
    tol = evals[:, -1:].clamp_min(0.0) * (_RELATIVE_EIG_TOL * x.shape[-2])  # (b, 1)
    s = torch.where(evals > tol, evals.clamp_min(0.0).sqrt(), 0.0)  # (b, m)
    if uvt is not None:
        inv_s = torch.where(s > 0, s.clamp_min(torch.finfo(s.dtype).tiny).reciprocal(), 0.0)
        proj = (u * inv_s.unsqueeze(-2)) @ u.mT  # (b, m, m)
        uvt.copy_(proj @ x64)
    return s.sum(-1)


@functools.lru_cache(maxsize=1)
def _numba_kernel():  # -> the compiled kernel, or None when numba cannot be imported
    try:
        from pretrain._jacobi import nuclear_norm_kernel
    except ImportError as exc:  # numba is an install requirement; a test hides it
        warnings.warn(
            f"numba unavailable ({exc}); nuclear_norm uses the slower LAPACK path", stacklevel=3
        )
        return None
    return nuclear_norm_kernel


def cpu_backend() -> str:
    """The CPU backend in use: ``$LORAC_NUCLEAR_NORM_CPU`` if set, else numba when available."""
    choice = os.environ.get(_BACKEND_ENV, "").strip().lower()
    if choice and choice not in CPU_BACKENDS:
        raise ValueError(f"{_BACKEND_ENV}={choice!r}: expected one of {', '.join(CPU_BACKENDS)}")
    if choice == "lapack" or _numba_kernel() is None:
        return "lapack"
    return "numba"


def _block_numba(x: torch.Tensor, uvt: torch.Tensor | None) -> torch.Tensor:
    """_block_numpy by the compiled kernel (``pretrain._jacobi``)."""
    x_np = np.ascontiguousarray(x.numpy())
    norms = np.empty(x_np.shape[0], dtype=np.float64)
    out = uvt.numpy() if uvt is not None else np.empty((0, 0, 0), dtype=x_np.dtype)
    _numba_kernel()(x_np, out, norms, uvt is not None, _RELATIVE_EIG_TOL * x_np.shape[-2])
    return torch.from_numpy(norms)


def _decompose(
    x: torch.Tensor, with_grad: bool, backend: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Nuclear norms (...) float64 of ``x`` (..., m, n) and, if ``with_grad``, U V^T like ``x``.

    ``backend`` is :func:`cpu_backend` for a CPU ``x`` (ignored on other devices).
    """
    transposed = x.shape[-2] > x.shape[-1]
    short = x.detach().mT if transposed else x.detach()  # (..., k, l), k <= l
    flat = short.reshape(-1, *short.shape[-2:])  # (B, k, l), a view where possible
    uvt = torch.empty(flat.shape, dtype=x.dtype, device=x.device) if with_grad else None
    batch, threads = flat.shape[0], torch.get_num_threads()
    if x.device.type != "cpu":
        values = _block_torch(flat, uvt)
    elif backend == "numba":
        # One thread: measured interleaved with other torch ops (benchmarks/), a second thread
        # gained <= 10% even at 4096 matrices, as torch's OpenMP workers keep spinning on the
        # other core after each parallel op.
        values = _block_numba(flat, uvt)
    elif threads < 2 or batch < _MIN_BATCH_TO_SPLIT:
        values = _block_numpy(flat, uvt)
    else:
        # torch loops over the batch's LAPACK calls serially: give each thread its own share.
        edges = [batch * i // threads for i in range(threads + 1)]
        parts = [
            (flat[lo:hi], None if uvt is None else uvt[lo:hi])
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ]
        pool = _executor(threads - 1, os.getpid())
        futures = [pool.submit(_block_numpy, *part) for part in parts[1:]]
        values = torch.cat([_block_numpy(*parts[0])] + [f.result() for f in futures])
    values = values.reshape(short.shape[:-2])
    if uvt is None:
        return values, None
    uvt = uvt.reshape(short.shape)
    return values, (uvt.mT if transposed else uvt)


class _NuclearNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, backend: str | None) -> torch.Tensor:  # type: ignore[override]
        values, uvt = _decompose(x, with_grad=True, backend=backend)
        ctx.save_for_backward(uvt)
        return values.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (uvt,) = ctx.saved_tensors
        if uvt.device.type != "cpu":
            return grad_out[..., None, None] * uvt, None
        # numpy: no OpenMP fork/join for one multiply; one (B, m * n) by (B, 1) broadcast is
        # cheaper than numpy's (..., 1, 1) by (..., m, n) one (measured, benchmarks/).
        u = uvt.numpy()
        g = grad_out.detach().numpy().astype(u.dtype, copy=False).reshape(-1, 1)
        return torch.from_numpy((u.reshape(g.shape[0], -1) * g).reshape(u.shape)), None


def nuclear_norm(x: torch.Tensor) -> torch.Tensor:
    """Sum of singular values of each matrix in ``x``.

    Args:
        x: (..., m, n) floating tensor, any batch shape.

    Returns:
        (...) tensor of nuclear norms in ``x.dtype`` (float16/bfloat16 inputs are computed in
        float64 and returned in float32, so callers under autocast keep the prior in full
        precision). Differentiable once, with gradient U V^T on the non-zero singular subspace.

    Raises:
        ValueError: if ``x`` has fewer than 2 dimensions, is not floating point, or is empty.
        A matrix batch holding NaN or inf gives NaN (no LAPACK error).
    """
    if x.dim() < 2:
        raise ValueError(f"nuclear_norm expects (..., m, n), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"nuclear_norm expects a floating tensor, got {x.dtype}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"nuclear_norm got an empty matrix shape {tuple(x.shape)}")
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    backend = cpu_backend() if x.device.type == "cpu" else None
    if backend != "numba" and not bool(torch.isfinite(x).all()):
        # LAPACK's eigh raises on NaN/inf; propagate NaN instead (like torch.linalg) so callers'
        # non-finite checks report the problem. The multiply keeps the autograd graph. (The numba
        # kernel checks each matrix itself, saving a pass over x, and gives NaN there too.)
        return x.sum((-2, -1)) * float("nan")
    if torch.is_grad_enabled() and x.requires_grad:
        return _NuclearNorm.apply(x, backend)
    return _decompose(x, with_grad=False, backend=backend)[0].to(x.dtype)
