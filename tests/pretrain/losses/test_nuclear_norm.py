"""nuclear_norm against float64 SVD, analytic rank-deficient cases, and gradcheck.

Every exactness test runs for both eigensolvers (the ``method`` fixture): ``eigh`` (what the CPU
runs under "auto") and the sync-free ``jacobi`` (what a GPU runs); then Jacobi's own checks:
its worst-case spectra, its sweep count, "auto"'s choice, no host sync, and torch.compile.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch

from pretrain.losses import nuclear
from pretrain.losses.nuclear import (
    NUCLEAR_NORM_METHODS,
    auto_method,
    jacobi_eigh,
    nuclear_norm,
)

METHODS = ("eigh", "jacobi")


@pytest.fixture(params=METHODS)
def method(request: pytest.FixtureRequest) -> str:
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


def value_and_grad(x: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    value = nuclear_norm(x, method=method)
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
def test_full_rank_matches_float64_svd(
    shape: tuple[int, ...], dtype: torch.dtype, method: str
) -> None:
    x = _randn(*shape, seed=sum(shape), dtype=dtype)
    value, grad = value_and_grad(x, method)
    ref_value, ref_grad = reference(x)
    assert value.dtype == grad.dtype == dtype and value.shape == shape[:-2]
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(value.double(), ref_value, rtol=tol, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=10 * tol)


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1e8, 1e30])
def test_extreme_scales_float64(scale: float, method: str) -> None:
    """The float64 Gram matrix neither underflows nor overflows here: values stay exact."""
    x = _randn(40, 8, 16, seed=13, dtype=torch.float64) * scale
    value, grad = value_and_grad(x, method)
    ref_value, ref_grad = reference(x)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


@pytest.mark.parametrize("m", [2, 5, 8])
def test_identical_rows(m: int, method: str) -> None:
    """m copies of r: value sqrt(m) ||r||, minimum-norm subgradient 1/sqrt(m) * r/||r|| per row."""
    r = _randn(4, 1, 128, seed=m)
    x = r.expand(4, m, 128).contiguous()
    value, grad = value_and_grad(x, method)
    norm = r.double().norm(dim=-1)  # (4, 1)
    torch.testing.assert_close(value.double(), math.sqrt(m) * norm[:, 0], rtol=1e-6, atol=0)
    assert torch.isfinite(grad).all()
    expected = (r.double() / (math.sqrt(m) * norm.unsqueeze(-1))).expand(4, m, 128)
    torch.testing.assert_close(grad.double(), expected, rtol=0, atol=1e-6)


def test_zero_matrix(method: str) -> None:
    x = torch.zeros(3, 8, 128)
    value, grad = value_and_grad(x, method)
    assert (value == 0).all()
    assert torch.isfinite(grad).all() and (grad == 0).all()


@pytest.mark.parametrize("transpose", [False, True])
def test_exact_rank_two(transpose: bool, method: str) -> None:
    """8 rows spanning a 2-D space: value and U V^T of the two non-zero singular values."""
    x = _randn(5, 8, 2, seed=1, dtype=torch.float64) @ _randn(
        5, 2, 128, seed=2, dtype=torch.float64
    )
    x = x.float()
    if transpose:
        x = x.mT
    value, grad = value_and_grad(x, method)
    ref_value, ref_grad = reference(x, rel_tol=1e-5)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(value.double(), ref_value, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=1e-5)
    # Zero singular values contribute nothing: the gradient itself has rank 2.
    assert (torch.linalg.svdvals(grad.double())[..., 2] < 1e-5).all()


def test_nearly_identical_rows_beat_float32_gram(method: str) -> None:
    """Rows r + 1e-3 noise: float32 to ~1e-7 relative, where sqrt(eigvalsh(X X^T)) is off ~1e-4."""
    r = _randn(16, 1, 128, seed=4)
    x = r + 1e-3 * _randn(16, 6, 128, seed=5)
    ref_value, ref_grad = reference(x)
    shortcut = torch.linalg.eigvalsh(x @ x.mT).clamp_min(0).sqrt().sum(-1)
    value, grad = value_and_grad(x, method)
    tol = {"rtol": 1e-6, "atol": 0}
    with pytest.raises(AssertionError):
        torch.testing.assert_close(shortcut.double(), ref_value, **tol)
    torch.testing.assert_close(value.double(), ref_value, **tol)
    # Gradient components along singular values ~1e-3 of the largest are still exact.
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=1e-5)


def test_gradcheck_float64(method: str) -> None:
    x = _randn(3, 4, 6, seed=6, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: nuclear_norm(t, method), (x,))
    xt = _randn(2, 5, 3, seed=7, dtype=torch.float64).requires_grad_(True)  # m > n
    assert torch.autograd.gradcheck(lambda t: nuclear_norm(t, method), (xt,))


def test_upstream_gradient_is_applied_per_matrix(method: str) -> None:
    x = _randn(4, 3, 10, seed=8).requires_grad_(True)
    weights = torch.tensor([1.0, -2.0, 0.5, 0.0])
    (grad,) = torch.autograd.grad((nuclear_norm(x, method) * weights).sum(), x)
    _, ref_grad = reference(x.detach())
    torch.testing.assert_close(grad.double(), weights.double()[:, None, None] * ref_grad)


def test_no_grad_and_non_contiguous_input(method: str) -> None:
    """Values without autograd (eigenvalues only) and from a strided view equal the graph path."""
    base = _randn(10, 128, 6, seed=9)
    x = base.transpose(-1, -2)  # (10, 6, 128), not contiguous, as LORAC builds its (N, M, d)
    with torch.no_grad():
        plain = nuclear_norm(x, method)
    value, _ = value_and_grad(x, method)
    torch.testing.assert_close(plain, value, rtol=1e-7, atol=0)
    torch.testing.assert_close(value.double(), reference(x)[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_input_returns_float32(dtype: torch.dtype, method: str) -> None:
    x = _randn(4, 5, 32, seed=10).to(dtype).requires_grad_(True)
    value = nuclear_norm(x, method)
    assert value.dtype == torch.float32 and torch.isfinite(value).all()
    torch.testing.assert_close(value.double(), reference(x.detach())[0], rtol=1e-6, atol=0)
    value.sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_double_backward_is_refused(method: str) -> None:
    x = _randn(2, 3, 5, seed=11, dtype=torch.float64).requires_grad_(True)
    (grad,) = torch.autograd.grad(nuclear_norm(x, method).sum(), x, create_graph=True)
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


def test_unknown_method_raises() -> None:
    with pytest.raises(ValueError, match="'svd' is not one of \\('auto', 'eigh', 'jacobi'\\)"):
        nuclear_norm(torch.ones(2, 3), method="svd")


def test_non_finite_input_gives_nan_per_matrix(method: str) -> None:
    """A matrix holding NaN or inf gives NaN (value and gradient); the other matrices are exact."""
    x = torch.randn(4, 3, 8, requires_grad=True)
    bad = x.detach().clone()
    bad[1, 0, 0] = float("nan")
    bad[2, 1, 1] = float("inf")
    bad.requires_grad_()
    out = nuclear_norm(bad, method)
    assert out.shape == (4,) and torch.isnan(out[1:3]).all()
    out.sum().backward()
    assert bad.grad is not None and torch.isnan(bad.grad[1:3]).all()
    torch.testing.assert_close(out[[0, 3]].double(), reference(x.detach()[[0, 3]])[0])
    _, ref_grad = reference(x.detach()[[0, 3]])
    torch.testing.assert_close(bad.grad[[0, 3]].double(), ref_grad, rtol=0, atol=1e-6)


def _count_syncs(method: str, x: torch.Tensor) -> collections.Counter[str]:
    """Host syncs of a forward + backward and a no-grad forward, as a GPU would make them:
    ``x`` counts as a device tensor (the step counter, which also sees the syncs
    inside ops such as eigh's error check)."""
    from pretrain.diagnostics.op_counter import StepCounter

    leaf = x.detach().clone().requires_grad_(True)
    counter = StepCounter()
    counter.mark(leaf)
    with counter:
        nuclear_norm(leaf, method).sum().backward()
        with torch.no_grad():
            nuclear_norm(leaf, method)
    return counter.syncs


def test_no_host_sync_forward_or_backward() -> None:
    """Jacobi makes no host sync, forward or backward (finiteness handling, rotations, index
    tables included); eigh's two (forward with vectors, eigvalsh without) are counted."""
    x = _randn(6, 5, 32, seed=12)
    x[2, 1, 3] = float("nan")  # the per-matrix NaN path is device-side too
    nuclear_norm(x, "jacobi")  # the first call per (size, device) copies the index tables
    assert _count_syncs("jacobi", x) == {}
    eigh = _count_syncs("eigh", x)
    assert sum(eigh.values()) == 2 and all("_linalg_eigh" in k for k in eigh), eigh


def test_jacobi_index_tables_are_copied_to_the_device_once_per_size() -> None:
    """The round-robin index tables are copied to the matrices' device by the first call of a
    size only: later calls make no blocking host-to-device copy."""
    from pretrain.diagnostics.op_counter import StepCounter

    def syncs(x: torch.Tensor) -> collections.Counter[str]:
        counter = StepCounter()
        counter.mark(x)
        with counter, torch.no_grad():
            nuclear_norm(x, "jacobi")
        return counter.syncs

    x = _randn(2, 9, 12, seed=13)  # 9 rows (tables of 10): a size no other test here uses
    first = syncs(x)
    assert sum(first.values()) == 2, first  # the two tables, once
    assert all("torch.tensor(..., device=...)" in k for k in first), first
    assert syncs(x * 2) == {}


def test_a_jacobi_sweep_rotates_every_pair_of_rows() -> None:
    """One sweep meets every pair (i, j) of an 8 x 8 matrix: a matrix whose only off-diagonal
    entry is at (i, j) is diagonalised by it, for each of the 28 pairs."""
    pairs = [(i, j) for i in range(8) for j in range(i + 1, 8)]
    gram = torch.diag(torch.arange(1.0, 9.0, dtype=torch.float64)).repeat(len(pairs), 1, 1)
    for b, (i, j) in enumerate(pairs):
        gram[b, i, j] = gram[b, j, i] = 0.7
    evals, _ = jacobi_eigh(gram, vectors=False, sweeps=1)
    exact = torch.linalg.eigvalsh(gram)
    torch.testing.assert_close(evals.sort(-1).values, exact, rtol=0, atol=1e-13)
    unrotated, _ = jacobi_eigh(gram, vectors=False, sweeps=0)  # the check can fail
    assert ((unrotated.sort(-1).values - exact).abs().amax(-1) > 0.05).all()


def test_method_names_and_what_auto_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "auto" is Jacobi only for CUDA matrices with a short side up to the limit; the CPU keeps
    eigh (bit for bit: the golden runs do not change); an explicit method is taken as asked."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # CUDA tensors on this CPU

    assert NUCLEAR_NORM_METHODS == ("auto", "eigh", "jacobi")
    limit = nuclear.JACOBI_AUTO_MAX_SIDE
    assert auto_method("cuda", 5) == auto_method("cuda", limit) == "jacobi"
    assert auto_method("cuda", limit + 1) == auto_method("cpu", 5) == auto_method("meta", 5)
    assert auto_method("cpu", 5) == "eigh"
    ran: list[tuple[int, ...]] = []

    def jacobi(gram: torch.Tensor, vectors: bool = True, sweeps: int | None = None) -> tuple:
        # recorded, and answered by eigh: no index table is cached for a fake device
        ran.append(tuple(gram.shape))
        return torch.linalg.eigh(gram) if vectors else (torch.linalg.eigvalsh(gram), None)

    monkeypatch.setattr(nuclear, "jacobi_eigh", jacobi)

    def picks(device: str, shape: tuple[int, ...], method: str = "auto") -> str:
        ran.clear()
        with FakeTensorMode():
            nuclear_norm(torch.empty(shape, device=device), method)
        return "jacobi" if ran else "eigh"

    assert picks("cuda", (256, 5, 128)) == picks("cuda", (4, 128, limit)) == "jacobi"
    assert picks("cuda", (4, limit + 1, 128)) == picks("cuda", (2, 128, 128)) == "eigh"
    assert picks("cpu", (256, 5, 128)) == "eigh"
    assert picks("cpu", (2, 40, 50), "jacobi") == "jacobi"
    assert picks("cuda", (2, 5, 128), "eigh") == "eigh"
    monkeypatch.undo()
    x = _randn(5, 6, 20, seed=14).requires_grad_(True)
    value, grad = value_and_grad(x, "auto")
    ref_value, ref_grad = value_and_grad(x, "eigh")
    assert torch.equal(value, ref_value) and torch.equal(grad, ref_grad)


def _spectrum(k: int, s: list[float], seed: int, batch: int = 16) -> torch.Tensor:
    """(batch, k, 24) float64 matrices with singular values ``s[:k]`` and random singular
    vectors."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(batch, k, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(batch, 24, k, generator=gen, dtype=torch.float64))
    return (u * torch.tensor(s[:k], dtype=torch.float64)) @ v.mT


def _worst_cases(k: int) -> dict[str, tuple[torch.Tensor, float]]:
    """Spectra that are slow for Jacobi (repeated and clustered singular values, the zero one of
    rank-deficient matrices), graded rows and nearly identical rows, for a k x k Gram matrix,
    each with the gradient's tolerance: a float64 Gram matrix gives U V^T to about
    eps * sigma_max^2 / sigma_min^2 (eigh's errors are 1/4 to 1/10 of these)."""
    half = max(k // 2, 1)
    rows = _randn(16, 1, 24, seed=k, dtype=torch.float64)
    graded = torch.logspace(0, -3, k, dtype=torch.float64)[:, None]
    return {
        "equal": (_spectrum(k, [1.0] * k, seed=k), 1e-13),
        "rank_half_equal": (_spectrum(k, [1.0] * half + [0.0] * k, seed=k + 1), 1e-13),
        "two_clusters": (_spectrum(k, [1.0] * half + [1e-2] * k, seed=k + 2), 1e-11),
        "near_pairs": (_spectrum(k, [1.0, 1 + 1e-10, 0.3, 0.3 + 3e-13] + [0.1] * k, k), 1e-13),
        "geometric": (_spectrum(k, torch.logspace(0, -3, max(k, 2)).tolist(), k + 4), 5e-10),
        "graded_rows": (_randn(16, k, 24, seed=k + 5, dtype=torch.float64) * graded, 1e-12),
        "nearly_identical_rows": (rows + 1e-3 * _randn(16, k, 24, seed=k + 6), 5e-9),
    }


@pytest.mark.parametrize("k", range(1, 9))
def test_worst_case_spectra_match_float64_svd(k: int, method: str) -> None:
    """Both methods on the spectra where Jacobi converges slowest, to what a float64 Gram matrix
    allows: values to 1e-12 relative, gradients to the case's tolerance."""
    for name, (x, grad_tol) in _worst_cases(k).items():
        value, grad = value_and_grad(x, method)
        ref_value, ref_grad = reference(x, rel_tol=1e-6)
        torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0, msg=name)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=grad_tol, msg=name)


@pytest.mark.parametrize("k", [3, 5, 8])
def test_jacobi_sweeps_are_converged(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three times the sweeps changes nothing that matters (the fixed count has converged on the
    worst cases), while two sweeps would not have: the check can fail."""
    cases = {name: x for name, (x, _) in _worst_cases(k).items()}
    default = {name: value_and_grad(x, "jacobi") for name, x in cases.items()}
    sweeps = nuclear.jacobi_sweeps
    for count, converged in [(lambda n: 3 * sweeps(n), True), (lambda n: 2, False)]:
        monkeypatch.setattr(nuclear, "jacobi_sweeps", count)
        value_change = grad_change = 0.0
        for name, x in cases.items():
            value, grad = value_and_grad(x, "jacobi")
            value_change = max(value_change, ((value - default[name][0]) / value).abs().max())
            grad_change = max(grad_change, (grad - default[name][1]).abs().max())
        assert (value_change <= 1e-14 and grad_change <= 1e-12) == converged, grad_change


@pytest.mark.parametrize("k", [1, 2, 3, 6, 33])
def test_jacobi_eigh_decomposes_any_size(k: int) -> None:
    """Eigenpairs of symmetric matrices (indefinite ones too), k odd (padded) or even, and past
    "auto"'s limit (Jacobi asked for explicitly works at any size, only slower)."""
    a = _randn(3, k, k, seed=15, dtype=torch.float64)
    gram = torch.cat([a @ a.mT, a + a.mT])  # (6, k, k): PSD, then indefinite
    w, v = jacobi_eigh(gram)
    assert w.shape == (6, k) and v is not None and v.shape == (6, k, k)
    scale = gram.flatten(-2).norm(dim=-1)[:, None, None]
    close = {"rtol": 0.0, "atol": 1e-14}
    torch.testing.assert_close((v * w.unsqueeze(-2)) @ v.mT / scale, gram / scale, **close)
    torch.testing.assert_close(v.mT @ v, torch.eye(k, dtype=torch.float64).expand_as(v), **close)
    ref = torch.linalg.eigvalsh(gram) / scale[..., 0]
    torch.testing.assert_close(w.sort(-1).values / scale[..., 0], ref, **close)
    w_only, none = jacobi_eigh(gram, vectors=False)
    assert none is None and torch.equal(w_only, w)
    if k == 33:
        x = _randn(2, 33, 40, seed=16, dtype=torch.float64)
        value, grad = value_and_grad(x, "jacobi")
        ref_value, ref_grad = reference(x)
        torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


def test_jacobi_compiles_without_graph_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile(fullgraph=True) of the Jacobi path, forward and backward, equals eager in
    float64. One sweep of an odd size (the padding) keeps the compile short: every sweep and
    round runs the same ops, so a graph break would show here. ``aot_eager``: dynamo's and
    autograd's trace as on a GPU, without inductor's C++ build of CPU kernels."""
    monkeypatch.setattr(nuclear, "jacobi_sweeps", lambda k: 1)
    x = _randn(2, 3, 4, seed=17, dtype=torch.float64)
    compiled = torch.compile(
        lambda t: nuclear_norm(t, method="jacobi"), fullgraph=True, backend="aot_eager"
    )
    leaf = x.clone().requires_grad_(True)
    value = compiled(leaf)
    (grad,) = torch.autograd.grad(value.sum(), leaf)
    ref_value, ref_grad = value_and_grad(x, "jacobi")
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_auto_is_jacobi_without_a_sync() -> None:
    """On CUDA, "auto" runs Jacobi: CUDA's own detector sees no sync (forward, backward, no
    grad) after the first call, and the result equals the CPU's eigh."""
    x = _randn(32, 5, 128, seed=18, dtype=torch.float64)
    xc = x.cuda().requires_grad_(True)
    nuclear_norm(xc).sum().backward()  # builds the index tables (one copy)
    xc.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        value = nuclear_norm(xc)
        value.sum().backward()
        with torch.no_grad():
            nuclear_norm(xc)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref_value, ref_grad = value_and_grad(x, "eigh")
    torch.testing.assert_close(value.cpu(), ref_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(xc.grad.cpu(), ref_grad, rtol=0, atol=1e-11)
