"""Compiled CPU kernel for ``pretrain.nuclear_norm``: many small matrices at once.

Why hand-written: LORAC needs the nuclear norm and its gradient U V^T of many tiny matrices (one
(M, d) matrix per instance, M <= 8, d = 128). Every library route runs one LAPACK call per matrix
(``torch.linalg.eigh``/``svd`` and numpy loop over the batch), and for an 8 x 8 problem that call
costs ~5 us, mostly overhead; torch-op batched solvers pay ~10 us per op instead. This kernel is
compiled by numba (a maintained JIT) and does the whole job per matrix in one pass over the data:

1. the Gram matrix G = X X^T of the short side in float64 (so singular values are exact to
   float32 precision; a float32 Gram would lose half the mantissa);
2. the eigendecomposition G = V diag(lambda) V^T by the cyclic Jacobi method, run in lock-step on
   ``LANES`` matrices so each rotation step is one SIMD loop across matrices (branch-free angle
   formula below), until the off-diagonal mass of every matrix in the group is below
   ``OFF_DIAGONAL_TOL`` of its diagonal. Jacobi converges quadratically, also for repeated and zero
   eigenvalues (identical or zero rows), and is accurate to round-off in the eigenvalues;
3. s = sqrt(lambda) on the eigenvalues above ``relative_tol * max(lambda)`` (the rest are
   round-off of zero singular values), the norm sum(s), and, if asked, the exact gradient of the
   thin SVD restricted to the non-zero singular values, U V^T = V diag(1/s) V^T X, in float64.

Each matrix is divided by its largest diagonal entry before the rotations, so no input scale can
overflow or underflow the angle formula. Reassociation (``fastmath``) is allowed for the
float64 dot products through numba's flags below; a matrix holding NaN or inf gets NaN.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Matrices rotated together: one AVX-512 loop of 8 doubles x 4, small enough to stay in L1.
LANES = 32
# Stop once sum of squared off-diagonal entries <= OFF_DIAGONAL_TOL^2 * sum of squared diagonal.
OFF_DIAGONAL_TOL = 1e-15
# A safeguard only: quadratic convergence takes 5-7 sweeps for 8 x 8 matrices.
MAX_SWEEPS = 40

# "contract" (FMA) and "reassoc" (vectorised float64 sums); no "nnan"/"ninf": those would let
# LLVM assume away the zero checks below.
_FASTMATH = {"contract", "reassoc", "nsz", "arcp"}


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _rotate_rows(
    arr: np.ndarray, i: int, j: int, cos: np.ndarray, sin: np.ndarray
) -> None:  # pragma: no cover - compiled
    """(arr[i], arr[j]) <- (cos arr[i] - sin arr[j], sin arr[i] + cos arr[j]), lane by lane."""
    for lane in range(LANES):
        x = arr[i, lane]
        y = arr[j, lane]
        arr[i, lane] = cos[lane] * x - sin[lane] * y
        arr[j, lane] = sin[lane] * x + cos[lane] * y


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def nuclear_norm_kernel(
    x: np.ndarray, uvt: np.ndarray, norms: np.ndarray, with_grad: bool, relative_tol: float
) -> int:  # pragma: no cover - compiled
    """Nuclear norms of ``x`` (B, m, n), m <= n, C-contiguous.

    Writes ``norms`` (B,) float64 and, when ``with_grad``, ``uvt`` (B, m, n) in ``x``'s dtype;
    both are NaN for a matrix holding NaN or inf.
    Returns the number of Jacobi sweeps run, summed over the groups (for tests and benchmarks).
    """
    batch, m, n = x.shape
    # The upper triangle of the Gram matrices, one row of LANES per entry, lane (matrix) index
    # fastest: a[i * m + j, lane] = G[i, j] of matrix ``lane`` for i <= j (the rest is unused);
    # v[j * m + i, lane] = V[i, j]. Each step of a rotation is then one SIMD loop across matrices
    # over contiguous rows, and each entry is written once.
    a = np.empty((m * m, LANES))
    v = np.empty((m * m, LANES))
    cos = np.empty(LANES)
    sin = np.empty(LANES)
    tan = np.empty(LANES)
    scale = np.empty(LANES)
    finite = np.empty(LANES, dtype=np.bool_)
    sv = np.empty(m)
    inv_s = np.empty(m)
    vec = np.empty((m, m))  # eigenvectors of one matrix, as columns
    # U V^T = P X sums ``width`` rows of X per pass (4 or 8 terms at once; the padding rows of
    # x64 and columns of proj stay zero), so for M <= 8 each output row is written in one pass.
    width = 4 if m <= 4 else 8 * ((m + 7) // 8)
    proj = np.zeros((m, width))
    row = np.empty(n)
    x64 = np.zeros((width, n))  # one matrix in float64
    sweeps_run = 0
    for start in range(0, batch, LANES):
        lanes = min(LANES, batch - start)
        for lane in range(lanes):
            xb = x[start + lane]
            for i in range(m):
                for t in range(n):
                    x64[i, t] = xb[i, t]
            for i in range(m):
                for j in range(i, m):
                    acc = 0.0
                    for t in range(n):
                        acc += x64[i, t] * x64[j, t]
                    a[i * m + j, lane] = acc
        for lane in range(lanes, LANES):  # unused lanes: zero matrices (already converged)
            for i in range(m):
                for j in range(i, m):
                    a[i * m + j, lane] = 0.0
        for lane in range(LANES):
            # NaN/inf anywhere in a matrix makes a diagonal entry (a sum of squares) NaN or inf:
            # such a matrix gets NaN results and a zero matrix in the rotations.
            biggest = 0.0
            finite[lane] = True
            for i in range(m):
                if not math.isfinite(a[i * m + i, lane]):
                    finite[lane] = False
                biggest = max(biggest, a[i * m + i, lane])
            if not finite[lane]:
                for i in range(m):
                    for j in range(i, m):
                        a[i * m + j, lane] = 0.0
                biggest = 0.0
            scale[lane] = biggest if biggest > 0.0 else 1.0
        for i in range(m):
            for j in range(m):
                for lane in range(LANES):
                    v[i * m + j, lane] = 1.0 if i == j else 0.0
            for j in range(i, m):  # only the upper triangle is ever set or read
                for lane in range(LANES):
                    a[i * m + j, lane] /= scale[lane]
        for _ in range(MAX_SWEEPS):
            converged = True
            for lane in range(LANES):
                off = 0.0
                diag = 0.0
                for i in range(m):
                    diag += a[i * m + i, lane] ** 2
                    for j in range(i + 1, m):
                        off += a[i * m + j, lane] ** 2
                if off > OFF_DIAGONAL_TOL * OFF_DIAGONAL_TOL * diag:
                    converged = False
            if converged:
                break
            sweeps_run += 1
            for p in range(m - 1):
                for q in range(p + 1, m):
                    ipp, iqq, ipq = p * m + p, q * m + q, p * m + q
                    # The rotation that zeroes a_pq: tan t is the smaller root of
                    # t^2 + 2 theta t - 1 = 0, theta = (a_qq - a_pp) / (2 a_pq). Without dividing
                    # by a_pq, with d = a_qq - a_pp, r = sqrt(d^2 + 4 a_pq^2), h = |d| + r:
                    # t = sign(d) 2 a_pq / h and, as h^2 + 4 a_pq^2 = 2 r h,
                    # cos = h / sqrt(2 r h), sin = sign(d) 2 a_pq / sqrt(2 r h),
                    # 1 / h = 2 r / (2 r h): two square roots and one division per matrix, no
                    # branch; a_pq = d = 0 gives r h = 0 and the identity.
                    for lane in range(LANES):
                        apq = a[ipq, lane]
                        d = a[iqq, lane] - a[ipp, lane]
                        r = math.sqrt(d * d + 4.0 * apq * apq)
                        h = abs(d) + r
                        rh2 = 2.0 * r * h
                        inv = 1.0 / math.sqrt(rh2) if rh2 > 0.0 else 0.0
                        two_apq = 2.0 * apq if d >= 0.0 else -2.0 * apq
                        cos[lane] = h * inv if rh2 > 0.0 else 1.0
                        sin[lane] = two_apq * inv
                        tan[lane] = two_apq * (2.0 * r) * (inv * inv)
                    # A <- J^T A J changes rows and columns p and q only.
                    for k in range(m):
                        if k in (p, q):
                            continue
                        ikp = min(k, p) * m + max(k, p)
                        ikq = min(k, q) * m + max(k, q)
                        _rotate_rows(a, ikp, ikq, cos, sin)
                    for lane in range(LANES):
                        shift = tan[lane] * a[ipq, lane]
                        a[ipp, lane] -= shift
                        a[iqq, lane] += shift
                        a[ipq, lane] = 0.0
                    if with_grad:  # V <- V J: columns p and q
                        for k in range(m):
                            _rotate_rows(v, p * m + k, q * m + k, cos, sin)
        for lane in range(lanes):
            if not finite[lane]:
                norms[start + lane] = math.nan
                if with_grad:
                    uvt[start + lane] = math.nan
                continue
            largest = 0.0
            for i in range(m):
                largest = max(largest, a[i * m + i, lane])
            cutoff = largest * relative_tol
            total = 0.0
            for i in range(m):
                lam = a[i * m + i, lane]
                sv[i] = math.sqrt(lam * scale[lane]) if lam > cutoff else 0.0
                total += sv[i]
            norms[start + lane] = total
            if not with_grad:
                continue
            for k in range(m):  # V diag(1/s) V^T on the non-zero singular subspace
                inv_s[k] = 1.0 / sv[k] if sv[k] > 0.0 else 0.0
                for i in range(m):
                    vec[i, k] = v[k * m + i, lane]
            for i in range(m):
                for j in range(i + 1):
                    acc = 0.0
                    for k in range(m):
                        acc += vec[i, k] * vec[j, k] * inv_s[k]
                    proj[i, j] = acc
                    proj[j, i] = acc
            xb = x[start + lane]
            for i in range(m):
                for t in range(n):
                    x64[i, t] = xb[i, t]
            out = uvt[start + lane]
            for i in range(m):  # (V diag(1/s) V^T) X, accumulated in float64
                if width == 4:
                    p0, p1, p2, p3 = proj[i, 0], proj[i, 1], proj[i, 2], proj[i, 3]
                    for t in range(n):
                        out[i, t] = (p0 * x64[0, t] + p1 * x64[1, t]) + (
                            p2 * x64[2, t] + p3 * x64[3, t]
                        )
                    continue
                for t in range(n):
                    row[t] = 0.0
                for j in range(0, width, 8):
                    p0, p1, p2, p3 = proj[i, j], proj[i, j + 1], proj[i, j + 2], proj[i, j + 3]
                    p4, p5, p6, p7 = proj[i, j + 4], proj[i, j + 5], proj[i, j + 6], proj[i, j + 7]
                    if width == 8:  # the whole sum in one pass, straight into the output
                        for t in range(n):
                            out[i, t] = (
                                (p0 * x64[0, t] + p1 * x64[1, t])
                                + (p2 * x64[2, t] + p3 * x64[3, t])
                            ) + (
                                (p4 * x64[4, t] + p5 * x64[5, t])
                                + (p6 * x64[6, t] + p7 * x64[7, t])
                            )
                        break
                    for t in range(n):
                        row[t] += (
                            (p0 * x64[j, t] + p1 * x64[j + 1, t])
                            + (p2 * x64[j + 2, t] + p3 * x64[j + 3, t])
                        ) + (
                            (p4 * x64[j + 4, t] + p5 * x64[j + 5, t])
                            + (p6 * x64[j + 6, t] + p7 * x64[j + 7, t])
                        )
                else:
                    for t in range(n):
                        out[i, t] = row[t]
    return sweeps_run
