"""The single-key loss of Eqs. (11)-(14) against a plain reading and against analytic values.

Queries (M-1, N, d), one key (N, d) and its negatives (K, d) enter lorac_loss / LoracLoss as the
one-key-crop layout of the module docstring (``one_key_crop`` below); the reference reads them
as they are.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pretrain.losses.lorac import LoracLoss, lorac_loss


def _unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g), dim=-1)


def one_key_crop(q, k, neg, lowrank=None):
    """views (M, N, d) with the key crop's own view first (the key: no query reads it, it is not
    in Q), keys (1, N, d), queues (1, K, d), and the layout arguments; ``lowrank`` indexes q."""
    views = torch.cat([k[None].to(q.dtype), q])
    low = range(q.shape[0]) if lowrank is None else lowrank
    layout = {"key_views": [0], "lowrank_views": [1 + i for i in low]}
    return (views, k[None], neg[None]), layout


def ours(q, k, neg, lowrank=None, **kwargs):
    """lorac_loss on the single-key inputs."""
    tensors, layout = one_key_crop(q, k, neg, lowrank)
    return lorac_loss(*tensors, **layout, **kwargs)


def ours_and_stats(q, k, neg, lowrank=None, **kwargs):
    """LoracLoss (the face that keeps the statistics) on the single-key inputs."""
    tensors, layout = one_key_crop(q, k, neg, lowrank)
    return LoracLoss(**layout, **kwargs)(*tensors)


def reference_loss(q, k, neg, tau, beta, prior, lowrank=None, c=None, c0=None, sigma2=None):
    """Eq. (12)-(13) written instance by instance, query by query, in float64."""
    q, k, neg = q.double(), k.double(), neg.double()
    m1, n, _ = q.shape
    views = list(range(m1)) if lowrank is None else list(lowrank)
    if prior == "batchwise" and not math.isinf(beta):
        rows = []
        for i in range(n):
            mu = sum(q[v, i] for v in views) / len(views)
            rows += [q[v, i] - mu for v in views]
        p = torch.stack(rows)
        shared = -torch.linalg.svdvals(p).sum() / (p.shape[0] * beta * tau)
    total = 0.0
    for i in range(n):
        qmat = torch.stack([q[v, i] for v in views] + [k[i]])
        m = qmat.shape[0]
        nuc = torch.linalg.svdvals(qmat).sum()
        if prior == "none" or math.isinf(beta):
            log_h = 0.0
        elif prior == "laplace":
            log_h = -nuc / (m * beta * tau)
        elif prior == "gaussian":
            log_h = -((nuc - c0) ** 2) / (sigma2 * m * tau)
        elif prior == "constant":
            log_h = -c / (m * beta * tau)
        else:
            log_h = shared
        li = 0.0
        for j in range(m1):
            pos = torch.exp(q[j, i] @ k[i] / tau) * math.exp(1) ** log_h
            negs = sum(torch.exp(q[j, i] @ neg[t] / tau) for t in range(neg.shape[0]))
            li = li - torch.log(pos / (pos + negs))
        total = total + li / m1
    return total / n


PRIOR_CASES = [
    ("laplace", {}),
    ("gaussian", {"c0": math.sqrt(5.0), "sigma2": 2.0}),
    ("constant", {"c": 3.0}),
    ("none", {}),
    ("batchwise", {}),
]


@pytest.mark.parametrize("prior,kw", PRIOR_CASES)
@pytest.mark.parametrize("lowrank", [None, [0, 2]])
def test_matches_reference_values_and_gradients(prior, kw, lowrank):
    q = _unit(4, 5, 16, seed=1).requires_grad_()
    k, neg = _unit(5, 16, seed=2), _unit(30, 16, seed=3)
    loss = ours(q, k, neg, lowrank, tau=0.2, beta=1.5, prior=prior, **kw)
    (g_ours,) = torch.autograd.grad(loss, q)
    q64 = q.detach().double().requires_grad_()
    ref = reference_loss(q64, k, neg, 0.2, 1.5, prior, lowrank, **kw)
    (g_ref,) = torch.autograd.grad(ref, q64)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(g_ours.double(), g_ref, atol=1e-6, rtol=1e-4)


def test_prior_changes_the_loss():
    """Guards the reference comparison: the priors really act (values differ from 'none')."""
    q, k, neg = _unit(3, 4, 8, seed=4), _unit(4, 8, seed=5), _unit(10, 8, seed=6)
    base = ours(q, k, neg, tau=0.2, beta=1.0, prior="none")
    for prior, kw in PRIOR_CASES[:3] + PRIOR_CASES[4:]:
        assert ours(q, k, neg, tau=0.2, beta=1.0, prior=prior, **kw) > base + 1e-3


def test_single_query_without_prior_is_infonce():
    q, k, neg = _unit(1, 6, 8, seed=7), _unit(6, 8, seed=8), _unit(20, 8, seed=9)
    logits = torch.cat([(q[0] * k).sum(1, keepdim=True), q[0] @ neg.t()], 1) / 0.07
    infonce = F.cross_entropy(logits, torch.zeros(6, dtype=torch.long))  # Eq. (1)
    assert ours(q, k, neg, tau=0.07, beta=1.0, prior="none").item() == pytest.approx(
        infonce.item(), rel=1e-6
    )


@pytest.mark.parametrize("prior", ["laplace", "constant", "batchwise", "gaussian"])
def test_beta_inf_is_multi_query_infonce(prior):
    q, k, neg = _unit(5, 6, 8, seed=10), _unit(6, 8, seed=11), _unit(20, 8, seed=12)
    per_query = []
    for m in range(5):
        logits = torch.cat([(q[m] * k).sum(1, keepdim=True), q[m] @ neg.t()], 1) / 0.2
        per_query.append(F.cross_entropy(logits, torch.zeros(6, dtype=torch.long)))
    expected = torch.stack(per_query).mean()
    got = ours(q, k, neg, tau=0.2, beta=math.inf, prior=prior, c=3.0, c0=1.0, sigma2=2.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_equal_logits_give_log_one_plus_k():
    """q orthogonal to the key and to every negative: all logits 0, loss = log(1 + K)."""
    d, K = 8, 15
    q = torch.zeros(2, 3, d)
    q[..., 0] = 1.0
    k = torch.zeros(3, d)
    k[:, 1] = 1.0
    neg = torch.zeros(K, d)
    neg[:, 2] = 1.0
    loss = ours(q, k, neg, tau=0.5, beta=1.0, prior="none")
    assert loss.item() == pytest.approx(math.log(1 + K), rel=1e-6)


def test_laplace_on_identical_rows_is_analytic():
    """All rows of Q identical unit vectors: ||Q||_* = sqrt(M), log h = -sqrt(M)/(M beta tau)."""
    d, K, tau, beta = 8, 7, 0.2, 2.0
    v = torch.zeros(d)
    v[0] = 1.0
    q, k = v.expand(3, 1, d).clone(), v.expand(1, d).clone()
    neg = torch.zeros(K, d)
    neg[:, 1] = 1.0
    m = 4
    pos = 1 / tau - math.sqrt(m) / (m * beta * tau)
    expected = -pos + math.log(math.exp(pos) + K)  # each negative logit is 0
    loss, stats = ours_and_stats(q, k, neg, tau=tau, beta=beta, prior="laplace")
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats.nuclear_norm.item() == pytest.approx(math.sqrt(m), rel=1e-6)


def test_prior_m_overrides_normaliser():
    q, k, neg = _unit(3, 4, 8, seed=13), _unit(4, 8, seed=14), _unit(10, 8, seed=15)
    a = ours(q, k, neg, tau=0.2, beta=2.0, prior="laplace", prior_m=8)
    b = ours(q, k, neg, tau=0.2, beta=2.0 * 8 / 4, prior="laplace")  # M_Q = 4 rows
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_bfloat16_inputs_computed_in_float32():
    q, k, neg = _unit(3, 4, 8, seed=16), _unit(4, 8, seed=17), _unit(10, 8, seed=18)
    full = ours(q, k, neg, tau=0.2, beta=1.0)
    low = ours(q.bfloat16(), k.bfloat16(), neg.bfloat16(), tau=0.2, beta=1.0)
    assert low.dtype == torch.float32
    assert low.item() == pytest.approx(full.item(), rel=2e-2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"tau": 0.0}, "tau"),
        ({"tau": -1.0}, "tau"),
        ({"beta": 0.0}, "beta"),
        ({"beta": -2.0}, "beta"),
        ({"prior": "cauchy"}, "prior"),
        ({"prior": "constant"}, "'c'|c "),
        ({"prior": "gaussian", "c0": 1.0, "sigma2": 0.0}, "sigma2"),
        ({"lowrank_views": [5]}, "lowrank_views"),
        ({"lowrank_views": []}, "lowrank_views"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, match):
    q, k, neg = _unit(3, 4, 8, seed=19), _unit(4, 8, seed=20), _unit(10, 8, seed=21)
    tensors, layout = one_key_crop(q, k, neg)  # 4 views
    args = layout | {"tau": 0.2, "beta": 1.0} | kwargs
    with pytest.raises(ValueError, match=match):
        lorac_loss(*tensors, **args)


def test_hyperparameters_are_validated_when_the_criterion_is_built():
    """Before any tensor, and again when the beta schedule sets beta; the class is named."""
    with pytest.raises(ValueError, match="^LoracLoss: tau "):
        LoracLoss(tau=0.0, beta=1.0, lowrank_views=[1])
    criterion = LoracLoss(tau=0.2, beta=1.0, lowrank_views=[1])
    with pytest.raises(ValueError, match="^LoracLoss: beta "):
        criterion.beta = 0.0
    assert criterion.beta == 1.0


def test_shape_mismatch_raises():
    q, k, neg = _unit(3, 4, 8, seed=22), _unit(4, 8, seed=30), _unit(10, 8, seed=23)
    (views, keys, queues), layout = one_key_crop(q, k, neg)
    args = layout | {"tau": 0.2, "beta": 1.0}
    with pytest.raises(ValueError, match="keys"):
        lorac_loss(views, _unit(1, 5, 8, seed=24), queues, **args)
    with pytest.raises(ValueError, match="queues"):
        lorac_loss(views, keys, _unit(1, 10, 7, seed=26), **args)
    # the single-key shapes are no second input form: a key (N, d) is refused, not guessed at
    with pytest.raises(ValueError, match=r"keys must be \(J, N, d\)"):
        lorac_loss(views, k, queues, **args)


@pytest.mark.parametrize("prior,beta", [("none", 1.0), ("laplace", math.inf), ("constant", 1.0)])
def test_stats_log_the_nuclear_norm_even_when_the_prior_is_off(prior, beta):
    q, k, neg = _unit(3, 4, 8, seed=27), _unit(4, 8, seed=28), _unit(10, 8, seed=29)
    _, stats = ours_and_stats(q, k, neg, tau=0.2, beta=beta, prior=prior, c=3.0)
    expected = torch.linalg.svdvals(torch.cat([q, k[None]]).transpose(0, 1).double()).sum(-1)
    assert stats.nuclear_norm.item() == pytest.approx(expected.mean().item(), rel=1e-5)


def test_log_prior_is_the_term_added_to_the_positive_logit():
    """LoracLoss.log_prior: log h(Q_i) = -||Q_i||_* / (M beta tau) per key crop and instance,
    with the norm it read and a gradient; stats.log_prior is its mean; zeros at beta = inf."""
    q, k, neg = _unit(3, 4, 8, seed=31), _unit(4, 8, seed=32), _unit(10, 8, seed=33)
    (views, keys, queues), layout = one_key_crop(q, k, neg)
    views.requires_grad_()
    criterion = LoracLoss(tau=0.2, beta=2.0, **layout)
    lp, nuc = criterion.log_prior(views, keys)
    expected = torch.linalg.svdvals(torch.cat([q, k[None]]).transpose(0, 1).double()).sum(-1)
    assert lp.shape == (1, 4) and lp.requires_grad
    assert torch.allclose(nuc.double(), expected, rtol=1e-5)
    assert torch.allclose(lp[0].double(), -expected / (4 * 2.0 * 0.2), rtol=1e-5)
    _, stats = criterion(views, keys, queues)
    assert stats.log_prior.item() == pytest.approx(lp.mean().item(), rel=1e-6)
    criterion.beta = math.inf
    assert not criterion.log_prior(views, keys)[0].any()
