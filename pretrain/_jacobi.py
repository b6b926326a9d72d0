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

Each group of matrices is scaled by its largest diagonal entry before the rotations, so no input
scale can overflow or underflow the angle formula. Reassociation (``fastmath``) is allowed for the
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


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def nuclear_norm_kernel(x, uvt, norms, with_grad, relative_tol):  # pragma: no cover - compiled
    """Nuclear norms of ``x`` (B, m, n), m <= n, C-contiguous.

    Writes ``norms`` (B,) float64 and, when ``with_grad``, ``uvt`` (B, m, n) in ``x``'s dtype;
    both are NaN for a matrix holding NaN or inf.
    Returns the number of Jacobi sweeps run, summed over the groups (for tests and benchmarks).
    """
    batch, m, n = x.shape
    # Column blocks, lane (matrix) index fastest: a[j, i * LANES + lane] = G[i, j] of matrix
    # ``lane``, v[j, i * LANES + lane] = V[i, j]. A rotation of columns p and q then reads and
    # writes contiguous blocks, one SIMD loop across matrices.
    a = np.empty((m, m * LANES))
    v = np.empty((m, m * LANES))
    cos = np.empty(LANES)
    sin = np.empty(LANES)
    tan = np.empty(LANES)
    scale = np.empty(LANES)
    finite = np.empty(LANES, dtype=np.bool_)
    sv = np.empty(m)
    inv_s = np.empty(m)
    vec = np.empty((m, m))  # eigenvectors of one matrix, as columns
    proj = np.empty((m, m))
    row = np.empty(n)
    x64 = np.empty((m, n))  # one matrix in float64
    sweeps_run = 0
    for start in range(0, batch, LANES):
        lanes = min(LANES, batch - start)
        for lane in range(lanes):
            xb = x[start + lane]
            for i in range(m):
                for t in range(n):
                    x64[i, t] = xb[i, t]
            for i in range(m):
                for j in range(i + 1):
                    acc = 0.0
                    for t in range(n):
                        acc += x64[i, t] * x64[j, t]
                    a[j, i * LANES + lane] = acc
                    a[i, j * LANES + lane] = acc
        for lane in range(lanes, LANES):  # unused lanes: zero matrices (already converged)
            for i in range(m):
                for j in range(m):
                    a[j, i * LANES + lane] = 0.0
        for lane in range(LANES):
            # NaN/inf anywhere in a matrix makes a diagonal entry (a sum of squares) NaN or inf:
            # such a matrix gets NaN results and a zero matrix in the rotations.
            biggest = 0.0
            finite[lane] = True
            for i in range(m):
                if not math.isfinite(a[i, i * LANES + lane]):
                    finite[lane] = False
                biggest = max(biggest, a[i, i * LANES + lane])
            if not finite[lane]:
                for i in range(m):
                    for j in range(m):
                        a[j, i * LANES + lane] = 0.0
                biggest = 0.0
            scale[lane] = biggest if biggest > 0.0 else 1.0
        for j in range(m):
            for i in range(m):
                o = i * LANES
                for lane in range(LANES):
                    a[j, o + lane] /= scale[lane]
                    v[j, o + lane] = 1.0 if i == j else 0.0
        for _ in range(MAX_SWEEPS):
            converged = True
            for lane in range(LANES):
                off = 0.0
                diag = 0.0
                for i in range(m):
                    diag += a[i, i * LANES + lane] ** 2
                    for j in range(i + 1, m):
                        off += a[j, i * LANES + lane] ** 2
                if off > OFF_DIAGONAL_TOL * OFF_DIAGONAL_TOL * diag:
                    converged = False
            if converged:
                break
            sweeps_run += 1
            for p in range(m - 1):
                ap = a[p]
                vp = v[p]
                for q in range(p + 1, m):
                    aq = a[q]
                    vq = v[q]
                    # The rotation that zeroes a_pq: tan t is the smaller root of
                    # t^2 + 2 theta t - 1 = 0, theta = (a_qq - a_pp) / (2 a_pq), written without
                    # dividing by a_pq so that a_pq = 0 gives t = 0 with no branch:
                    # t = sign(d) 2 a_pq / (|d| + sqrt(d^2 + 4 a_pq^2)), d = a_qq - a_pp.
                    for lane in range(LANES):
                        apq = ap[q * LANES + lane]
                        d = aq[q * LANES + lane] - ap[p * LANES + lane]
                        den = abs(d) + math.sqrt(d * d + 4.0 * apq * apq)
                        t = 2.0 * apq / den if den > 0.0 else 0.0
                        t = t if d >= 0.0 else -t
                        c = 1.0 / math.sqrt(1.0 + t * t)
                        cos[lane] = c
                        sin[lane] = t * c
                        tan[lane] = t
                    # A <- J^T A J changes rows and columns p and q only: update columns p, q
                    # (contiguous), then mirror them into rows p, q; A stays symmetric.
                    for k in range(m):
                        if k in (p, q):
                            continue
                        o = k * LANES
                        for lane in range(LANES):
                            akp = ap[o + lane]
                            akq = aq[o + lane]
                            ap[o + lane] = cos[lane] * akp - sin[lane] * akq
                            aq[o + lane] = sin[lane] * akp + cos[lane] * akq
                        ak = a[k]
                        for lane in range(LANES):
                            ak[p * LANES + lane] = ap[o + lane]
                            ak[q * LANES + lane] = aq[o + lane]
                    for lane in range(LANES):
                        shift = tan[lane] * ap[q * LANES + lane]
                        ap[p * LANES + lane] -= shift
                        aq[q * LANES + lane] += shift
                        ap[q * LANES + lane] = 0.0
                        aq[p * LANES + lane] = 0.0
                    if with_grad:
                        for k in range(m):
                            o = k * LANES
                            for lane in range(LANES):
                                vkp = vp[o + lane]
                                vkq = vq[o + lane]
                                vp[o + lane] = cos[lane] * vkp - sin[lane] * vkq
                                vq[o + lane] = sin[lane] * vkp + cos[lane] * vkq
        for lane in range(lanes):
            if not finite[lane]:
                norms[start + lane] = math.nan
                if with_grad:
                    uvt[start + lane] = math.nan
                continue
            largest = 0.0
            for i in range(m):
                largest = max(largest, a[i, i * LANES + lane])
            cutoff = largest * relative_tol
            total = 0.0
            for i in range(m):
                lam = a[i, i * LANES + lane]
                sv[i] = math.sqrt(lam * scale[lane]) if lam > cutoff else 0.0
                total += sv[i]
            norms[start + lane] = total
            if not with_grad:
                continue
            for k in range(m):  # V diag(1/s) V^T on the non-zero singular subspace
                inv_s[k] = 1.0 / sv[k] if sv[k] > 0.0 else 0.0
                for i in range(m):
                    vec[i, k] = v[k, i * LANES + lane]
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
            for i in range(m):  # (V diag(1/s) V^T) X, accumulated in float64
                for t in range(n):
                    row[t] = 0.0
                # Four rows of X per pass over ``row``: a quarter of the loads and stores.
                for j in range(0, m - 3, 4):
                    p0, p1, p2, p3 = proj[i, j], proj[i, j + 1], proj[i, j + 2], proj[i, j + 3]
                    for t in range(n):
                        row[t] += (
                            p0 * x64[j, t] + p1 * x64[j + 1, t] + p2 * x64[j + 2, t]
                        ) + p3 * x64[j + 3, t]
                for j in range(m - m % 4, m):
                    pij = proj[i, j]
                    for t in range(n):
                        row[t] += pij * x64[j, t]
                for t in range(n):
                    uvt[start + lane, i, t] = row[t]
    return sweeps_run
