"""Batched nuclear norm with an exact, finite gradient: eigh on the host's path, Jacobi on a GPU's.

Why not ``torch.linalg.matrix_norm(x, ord="nuc")``: its full SVD is slow for LORAC's many small
(M, d) matrices and its gradient is NaN/inf when singular values repeat or vanish. Why not the
float32 ``sqrt(eigvalsh(X X^T))``: squaring loses half the mantissa (~1e-4 relative error on
small singular values). Here the Gram matrix of the short side is eigendecomposed in float64, and
the gradient is the exact U V^T on the non-zero singular subspace (the minimum-norm subgradient),
U diag(1/s) U^T X, computed in the forward pass so that the backward is one multiply.

Eigensolvers (:data:`NUCLEAR_NORM_METHODS`):

* ``"eigh"``: ``torch.linalg.eigh``; on a GPU it reads LAPACK's ``info`` back, one host sync per
  call, which cannot be captured in a CUDA graph.
* ``"jacobi"``: cyclic Jacobi in float64 with a fixed number of sweeps (:func:`jacobi_sweeps`) in
  plain tensor ops: no host sync, no data-dependent shape or branch (CUDA graphs,
  ``torch.compile(fullgraph=True)``). Each sweep is k' - 1 rounds of k'/2 disjoint rotations
  (Brent and Luk's round-robin ordering; an odd k padded with a zero row and column).
* ``"auto"``: ``"jacobi"`` for CUDA matrices with a short side up to :data:`JACOBI_AUTO_MAX_SIDE`,
  ``"eigh"`` otherwise (the CPU golden runs are eigh's).

Cyclic Jacobi converges quadratically once the off-diagonal part is below half the eigenvalue
gaps (Henrici; Hari for multiple eigenvalues); for k <= 8 the measured worst case over random,
rank-deficient, graded and clustered spectra was k + 2 sweeps (``benchmarks/bench_nuclear_norm.py
--sweeps``). A rotation whose 2 x 2 block has eigenvalues equal to round-off is skipped: inside a
cluster of equal eigenvalues its angle is random and slows convergence to linear (11 sweeps
instead of 8 at k = 8, rank 4); skipping it changes eigenvalues by <= 2 eps * trace. Jacobi is
backward stable like eigh, and more accurate on graded matrices. A matrix holding NaN or inf
gives NaN (value and gradient) without a host sync: it is zeroed before the eigensolver and its
results replaced with ``torch.where``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from pretrain.utils.compiled import in_compiled_graph

__all__ = [
    "JACOBI_AUTO_MAX_SIDE",
    "NUCLEAR_NORM_METHODS",
    "auto_method",
    "jacobi_eigh",
    "jacobi_sweeps",
    "nuclear_norm",
]

# The values of ``nuclear_norm(method=...)`` (and of the config key that selects it).
NUCLEAR_NORM_METHODS = ("auto", "eigh", "jacobi")
# Under "auto", CUDA matrices with a short side up to this use Jacobi, longer ones eigh: Jacobi's
# rounds (~20 launches each) grow like k times its sweeps (45 at M = 5, 240 at 16, 744 at 32;
# benchmarks/bench_nuclear_norm.py --sides). 16 covers twice LORAC's largest M (8).
JACOBI_AUTO_MAX_SIDE = 16

# Eigenvalues below this fraction of the largest (times the short side) are treated as zero: in
# float64 the Gram matrix is accurate to ~1e-16 relative, so anything below ~1e-13 is round-off.
_RELATIVE_EIG_TOL = 1e-13
_EPS64 = torch.finfo(torch.float64).eps
# Index tables of the round-robin ordering, per (padded size, device); built on first use.
_ROUND_ROBIN: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def jacobi_sweeps(k: int) -> int:
    """Jacobi sweeps for a k x k Gram matrix: k + 4, at most ceil(k / 2) + 8 (k >= 3), at least
    2 above the worst case measured (k + 1 for k = 3..7, 10 for 8, 12 for 16, 16 for 32;
    ``benchmarks/bench_nuclear_norm.py --sweeps``)."""
    if k <= 2:
        return max(k - 1, 0)
    return min(k + 4, math.ceil(k / 2) + 8)


def _round_robin_orders(n: int) -> list[list[int]]:
    """For even n, the n - 1 rounds of the circle method, each as the order [p_1..p_h, q_1..q_h]
    that puts pair i's two indices at positions i and h + i (h = n / 2)."""
    orders = []
    for r in range(n - 1):
        pairs = [(n - 1, r)] + [((r + i) % (n - 1), (r - i) % (n - 1)) for i in range(1, n // 2)]
        orders.append([p for p, _ in pairs] + [q for _, q in pairs])
    return orders


def _round_robin_tables(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(start (n,), steps (n - 1, n)) int64: ``start`` takes the identity order to the last
    round's, ``steps[r]`` the order before round r to round r's. Cached per (n, device), since a
    list index on a CUDA tensor is a blocking copy (a CUDA graph is captured after a warm-up call).
    """
    if in_compiled_graph():
        return _build_round_robin_tables(n, device)
    key = (n, device)
    if key not in _ROUND_ROBIN:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"nuclear_norm(method='jacobi'): no index tables for size {n} on {device} yet; "
                "call it once before capturing a CUDA graph (a warm-up step)"
            )
        _ROUND_ROBIN[key] = _build_round_robin_tables(n, device)
    return _ROUND_ROBIN[key]


def _build_round_robin_tables(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    orders = _round_robin_orders(n)
    steps, previous = [], orders[-1]
    for order in orders:
        position = {index: i for i, index in enumerate(previous)}
        steps.append([position[index] for index in order])
        previous = order
    return torch.tensor(orders[-1], device=device), torch.tensor(steps, device=device)


def _rotations(a: torch.Tensor, tol: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """The (..., 2, 2, h) rotations [[c, -s], [s, c]] that zero a[i, h + i] for each i < h, of
    symmetric ``a`` (..., n, n); ``tol`` (..., 1) is its round-off level, ``one`` a 0-dim 1.

    t = s / c is the stable root sign(theta) / (|theta| + sqrt(theta^2 + 1)), theta = d / (2 a_pq),
    d = a_qq - a_pp, multiplied through by 2 |a_pq|: t = 2 a_pq / (d + copysign(hypot(d, 2 a_pq),
    d)), so that nothing divides by a_pq, overflows or makes a NaN. Skipped (t = 0) where the
    block's two eigenvalues differ by round-off (module docstring).
    """
    h = a.shape[-1] // 2
    diag = a.diagonal(dim1=-2, dim2=-1)
    d = diag[..., h:] - diag[..., :h]  # a_qq - a_pp, (..., h)
    two_apq = 2 * a[..., :h, h:].diagonal(dim1=-2, dim2=-1)  # (..., h)
    spread = torch.hypot(d, two_apq)  # the gap between the block's eigenvalues
    den = d + torch.copysign(spread.clamp_min(torch.finfo(a.dtype).tiny), d)
    t = torch.where(spread <= tol, 0.0, two_apq / den)
    c = torch.hypot(t, one).reciprocal()  # 1 exactly where t = 0
    s = t * c
    return torch.stack((c, -s, s, c), dim=-2).unflatten(-2, (2, 2))


def _rotate_rows(a: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """J^T a for (..., n, m) ``a``: rows i and h + i mixed by ``rot`` (..., 2, 2, h)."""
    n = a.shape[-2]
    terms = rot.unsqueeze(-1) * a.unflatten(-2, (1, 2, n // 2))  # (..., 2, 2, h, m)
    # the sum over the size-2 dimension as one add: a CPU reduction over it took most of the time
    return (terms.select(-3, 0) + terms.select(-3, 1)).flatten(-3, -2)  # (..., n, m)


def _rotate_columns(a: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """a J for (..., m, n) ``a``: columns i and h + i mixed by ``rot`` (..., 2, 2, h)."""
    n = a.shape[-1]
    terms = rot.unsqueeze(-4) * a.unflatten(-1, (1, 2, n // 2))  # (..., m, 2, 2, h)
    return (terms.select(-2, 0) + terms.select(-2, 1)).flatten(-2)  # (..., m, n)


def jacobi_eigh(
    gram: torch.Tensor, vectors: bool = True, sweeps: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Unsorted eigenvalues (..., k) and eigenvectors (..., k, k) (``gram ~= V diag(w) V^T``) of
    symmetric ``gram`` by cyclic Jacobi: no host sync, no data-dependent shape or branch."""
    k = gram.shape[-1]
    n = k + k % 2
    sweeps = jacobi_sweeps(k) if sweeps is None else sweeps
    start, steps = _round_robin_tables(n, gram.device)
    a = F.pad(gram, (0, n - k, 0, n - k))  # an odd k: a zero row and column nothing rotates
    # skip rotations within eps * trace: the round-off level of a (module docstring)
    tol = a.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True).abs() * (2 * _EPS64)  # (..., 1)
    one = gram.new_ones(())
    a = a.index_select(-2, start).index_select(-1, start)
    v = torch.eye(n, dtype=gram.dtype, device=gram.device).index_select(-1, start)
    v = v.expand(*gram.shape[:-2], n, n) if vectors else None
    for _ in range(sweeps):
        for r in range(n - 1):
            step = steps[r]
            a = a.index_select(-2, step).index_select(-1, step)
            rot = _rotations(a, tol, one)
            a = _rotate_columns(_rotate_rows(a, rot), rot)
            if v is not None:
                v = _rotate_columns(v.index_select(-1, step), rot)
    evals = a.diagonal(dim1=-2, dim2=-1)
    if n == k:
        return evals, v
    # The padding index sits at position 0 of every round's order, so of the last: its row and
    # column stayed exactly zero (eigenvalue 0, eigenvector e_k), and both are dropped.
    return evals[..., 1:], None if v is None else v[..., :k, 1:]


def _decompose(
    x: torch.Tensor, with_grad: bool, method: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Nuclear norms (...) float64 of ``x`` (..., m, n) and, if ``with_grad``, U V^T like ``x``."""
    transposed = x.shape[-2] > x.shape[-1]
    short = x.detach().mT if transposed else x.detach()  # (..., k, l), k <= l
    x64 = short.to(torch.float64, memory_format=torch.contiguous_format)  # (..., k, l)
    finite = torch.isfinite(x64).flatten(-2).all(-1)  # (...,)
    x64 = torch.where(finite[..., None, None], x64, 0.0)
    gram = x64 @ x64.mT  # (..., k, k)
    if method == "jacobi":
        evals, u = jacobi_eigh(gram, vectors=with_grad)  # (..., k) unsorted, (..., k, k)
    elif with_grad:
        evals, u = torch.linalg.eigh(gram)  # (..., k) ascending, (..., k, k)
    else:
        evals, u = torch.linalg.eigvalsh(gram), None  # no vectors: ~2x cheaper
    tol = evals.amax(-1, keepdim=True).clamp_min(0.0) * (_RELATIVE_EIG_TOL * short.shape[-2])
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
    def forward(ctx: FunctionCtx, x: torch.Tensor, method: str) -> torch.Tensor:  # type: ignore[override]
        values, uvt = _decompose(x, with_grad=True, method=method)
        ctx.save_for_backward(uvt)
        return values.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (uvt,) = ctx.saved_tensors
        return grad_out[..., None, None] * uvt, None


def auto_method(device_type: str, short_side: int) -> str:
    """The eigensolver ``method="auto"`` picks for matrices with this short side on this kind of
    device (the step counter asks it what a GPU would run)."""
    jacobi = device_type == "cuda" and short_side <= JACOBI_AUTO_MAX_SIDE
    return "jacobi" if jacobi else "eigh"


def _resolve_method(x: torch.Tensor, method: str) -> str:
    if method not in NUCLEAR_NORM_METHODS:
        raise ValueError(f"nuclear_norm method {method!r} is not one of {NUCLEAR_NORM_METHODS}")
    if method != "auto":
        return method
    return auto_method(x.device.type, min(x.shape[-2:]))


def nuclear_norm(x: torch.Tensor, method: str = "auto") -> torch.Tensor:
    """Sum of singular values of each matrix of ``x`` (..., m, n), by ``method`` (one of
    :data:`NUCLEAR_NORM_METHODS`, module docstring).

    Returns (...) in ``x.dtype``, float32 for float16/bfloat16 inputs (the prior keeps full
    precision under autocast); differentiable once. Raises ValueError on a tensor that is not a
    non-empty floating batch of matrices, or an unknown ``method``.
    """
    if x.dim() < 2:
        raise ValueError(f"nuclear_norm expects (..., m, n), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"nuclear_norm expects a floating tensor, got {x.dtype}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"nuclear_norm got an empty matrix shape {tuple(x.shape)}")
    method = _resolve_method(x, method)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if torch.is_grad_enabled() and x.requires_grad:
        return _NuclearNorm.apply(x, method)
    return _decompose(x, with_grad=False, method=method)[0].to(x.dtype)
