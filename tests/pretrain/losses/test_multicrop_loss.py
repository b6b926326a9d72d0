"""lorac_loss (LoracLoss as a function) against a plain float64 reading of the objective.

The reference below is written instance by instance, key crop by key crop, query by query, with
torch.linalg.svdvals for every nuclear norm; it shares no code with pretrain.losses.lorac.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from pretrain.losses.lorac import LoracLoss, lorac_loss, nuclear_norm
from pretrain.modeling.distributed import all_gather_with_grad


def _unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g), dim=-1)


def reference(views, keys, queues, key_views, low, tau, beta, prior, construction="instance",
              c=None, c0=None, sigma2=None):  # fmt: skip
    """The objective written literally (instance by instance, query by query) in float64."""
    views, keys, queues = views.double(), keys.double(), queues.double()
    v_count, n, _ = views.shape
    off = prior == "none" or math.isinf(beta)

    def log_h(mat):
        m = mat.shape[0]
        nuc = torch.linalg.svdvals(mat).sum()
        if off:
            return 0.0
        if prior == "laplace":
            return -nuc / (m * beta * tau)
        if prior == "gaussian":
            return -((nuc - c0) ** 2) / (sigma2 * m * tau)
        if prior == "constant":
            return -c / (m * beta * tau)
        raise AssertionError(prior)

    if prior == "batchwise" and not off:
        rows = []
        for i in range(n):
            mu = sum(views[v, i] for v in low) / len(low)
            rows += [views[v, i] - mu for v in low]
        p = torch.stack(rows)
        shared = -torch.linalg.svdvals(p).sum() / (p.shape[0] * beta * tau)
    total = 0.0
    for j, kv in enumerate(key_views):
        loss_j = 0.0
        for i in range(n):
            if prior == "batchwise":
                lh = 0.0 if off else shared
            elif construction == "instance":
                all_keys = [keys[t, i] for t in range(len(key_views))]
                q_mat = torch.stack([views[v, i] for v in low] + all_keys)
                lh = log_h(q_mat)
            else:
                q_mat = torch.stack([views[v, i] for v in low if v != kv] + [keys[j, i]])
                lh = log_h(q_mat)
            queries = [v for v in range(v_count) if v != kv]
            li = 0.0
            for v in queries:
                pos = torch.exp(views[v, i] @ keys[j, i] / tau + lh)
                negs = sum(
                    torch.exp(views[v, i] @ queues[j, t] / tau) for t in range(queues.shape[1])
                )
                li = li - torch.log(pos / (pos + negs))
            loss_j = loss_j + li / len(queries)
        total = total + loss_j / n
    return total / len(key_views)


PRIOR_CASES = [
    ("laplace", {}),
    ("gaussian", {"c0": math.sqrt(5.0), "sigma2": 2.0}),
    ("constant", {"c": 3.0}),
    ("none", {}),
    ("batchwise", {}),
]
# (V, key_views, lowrank_views): the paper's 3x224 + 5x96 layout, then two others
LAYOUTS = [
    (8, [0, 1], [0, 1, 2]),
    (4, [0], [1, 2, 3]),  # the M ablation: one key crop, every query in Q (Q has M = 4 rows)
    (5, [0, 1, 2], [0, 1, 2, 3]),
]


@pytest.mark.parametrize("prior,kw", PRIOR_CASES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["paper", "m_ablation", "three_keys"])
def test_matches_reference_values_and_gradients(prior, kw, layout):
    v, key_views, low = layout
    views = _unit(v, 4, 12, seed=1).requires_grad_()
    keys, queues = _unit(len(key_views), 4, 12, seed=2), _unit(len(key_views), 20, 12, seed=3)
    ours = lorac_loss(
        views, keys, queues, key_views=key_views, lowrank_views=low, tau=0.2, beta=1.5,
        prior=prior, **kw,
    )  # fmt: skip
    (g_ours,) = torch.autograd.grad(ours, views)
    v64 = views.detach().double().requires_grad_()
    ref = reference(v64, keys, queues, key_views, low, 0.2, 1.5, prior, **kw)
    (g_ref,) = torch.autograd.grad(ref, v64)
    assert ours.dtype == torch.float32
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(g_ours.double(), g_ref, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("prior,kw", PRIOR_CASES[:3])
def test_per_key_crop_construction_matches_reference(prior, kw):
    views = _unit(8, 3, 12, seed=4).requires_grad_()
    keys, queues = _unit(2, 3, 12, seed=5), _unit(2, 16, 12, seed=6)
    args = dict(key_views=[0, 1], lowrank_views=[0, 1, 2], tau=0.2, beta=2.0, prior=prior, **kw)
    ours = lorac_loss(views, keys, queues, q_construction="per_key_crop", **args)
    (g_ours,) = torch.autograd.grad(ours, views)
    v64 = views.detach().double().requires_grad_()
    ref = reference(v64, keys, queues, [0, 1], [0, 1, 2], 0.2, 2.0, prior, "per_key_crop", **kw)
    (g_ref,) = torch.autograd.grad(ref, v64)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(g_ours.double(), g_ref, atol=1e-6, rtol=1e-4)
    # and the two readings really differ (5-row vs 3-row Q)
    other = lorac_loss(views, keys, queues, **args)
    assert abs(other.item() - ours.item()) > 1e-4


def test_nuclear_norm_of_five_identical_unit_rows_is_sqrt5():
    """Theorem 1's minimum sqrt(M) at M = 5: the paper's c0 = sqrt(5) is this value."""
    row = _unit(1, 128, seed=7)
    q = row.expand(5, 128).unsqueeze(0).contiguous()
    assert nuclear_norm(q).item() == pytest.approx(math.sqrt(5.0), rel=1e-6)


def test_paper_layout_builds_five_row_q(monkeypatch):
    """The instance construction hands 5-row matrices to the nuclear norm at 3x224 + 5x96."""
    import pretrain.losses.lorac as losses

    shapes = []
    real = losses.nuclear_norm
    monkeypatch.setattr(
        losses, "nuclear_norm", lambda x, *a: shapes.append(tuple(x.shape)) or real(x, *a)
    )
    views, keys, queues = _unit(8, 3, 12, seed=8), _unit(2, 3, 12, seed=9), _unit(2, 8, 12, seed=1)
    losses.lorac_loss(
        views, keys, queues, key_views=[0, 1], lowrank_views=[0, 1, 2], tau=0.2, beta=2.0
    )
    assert shapes == [(3, 5, 12)]


def test_unread_views_are_never_read():
    """A lone key crop's own view (prior none) may hold anything: f skips it in MoCo-v2."""
    views = _unit(2, 4, 8, seed=2)
    keys, queues = _unit(1, 4, 8, seed=3), _unit(1, 8, 8, seed=4)
    args = dict(key_views=[0], lowrank_views=[1], tau=0.2, beta=math.inf, prior="none")
    clean = lorac_loss(views, keys, queues, **args)
    poisoned = views.clone()
    poisoned[0] = float("nan")
    assert lorac_loss(poisoned, keys, queues, **args).item() == clean.item()


def test_accuracy_uses_plain_similarities():
    """The logged accuracy ignores log h: a strong prior leaves it unchanged."""
    keys, queues = _unit(1, 16, 8, seed=6), _unit(1, 64, 8, seed=7)
    # queries near their key for half the instances, so the accuracy is strictly inside (0, 1)
    views = _unit(4, 16, 8, seed=5)
    views[:, :8] = F.normalize(keys[0, :8] + 0.3 * views[:, :8], dim=-1)
    args = dict(key_views=[0], lowrank_views=[0, 1, 2, 3], tau=0.2)
    _, off = LoracLoss(beta=math.inf, **args)(views, keys, queues)
    _, on = LoracLoss(beta=0.01, **args)(views, keys, queues)
    assert on.log_prior.item() < -10  # the prior's margin is huge ...
    assert on.accuracy.item() == off.accuracy.item()  # ... and does not move the accuracy
    assert 0 < off.accuracy.item() < 1


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"key_views": [0, 0]}, "key_views"),
        ({"key_views": [0]}, "key_views"),
        ({"lowrank_views": [9]}, "lowrank_views"),
        ({"lowrank_views": []}, "lowrank_views"),
        ({"q_construction": "rows"}, "q_construction"),
        ({"tau": 0.0}, "tau"),
        ({"prior": "cauchy"}, "prior"),
        ({"prior": "gaussian"}, "c0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    views, keys, queues = _unit(4, 2, 8, seed=1), _unit(2, 2, 8, seed=2), _unit(2, 4, 8, seed=3)
    args = dict(key_views=[0, 1], lowrank_views=[0, 1], tau=0.2, beta=2.0) | kwargs
    with pytest.raises(ValueError, match=name):
        lorac_loss(views, keys, queues, **args)


def test_float32_under_autocast():
    views = _unit(4, 3, 8, seed=1).bfloat16().requires_grad_()
    keys, queues = _unit(2, 3, 8, seed=2).bfloat16(), _unit(2, 4, 8, seed=3).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lorac_loss(
            views, keys, queues, key_views=[0, 1], lowrank_views=[0, 1, 2], tau=0.2, beta=2.0
        )
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(views.grad.float()).all()


# -- batchwise over two processes ------------------------------------------------------------
ARGS = dict(key_views=[0, 1], lowrank_views=[0, 1, 2], tau=0.2, beta=1.5, prior="batchwise")


def _data():
    return _unit(8, 6, 12, seed=11), _unit(2, 6, 12, seed=12), _unit(2, 16, 12, seed=13)


def _batchwise_worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        views, keys, queues = _data()
        half = views.shape[1] // world
        mine = views[:, rank * half : (rank + 1) * half].clone().requires_grad_()
        my_keys = keys[:, rank * half : (rank + 1) * half]
        gathered = all_gather_with_grad(mine[ARGS["lowrank_views"]], dim=1)
        loss = lorac_loss(mine, my_keys, queues, global_lowrank=gathered, **ARGS)
        loss.backward()
        torch.save({"loss": loss.detach(), "grad": mine.grad}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_batchwise_two_processes_equal_one_process(tmp_path):
    """P of Eq. (15) spans the global batch: 2 gloo processes with half the batch each give the
    one-process loss (mean of the two) and gradients (each process's gradient / 2, which is what
    DDP's averaging applies to the parameters)."""
    views, keys, queues = _data()
    full = views.clone().requires_grad_()
    loss = lorac_loss(full, keys, queues, **ARGS)
    loss.backward()
    init = f"file://{tmp_path}/store"
    mp.spawn(_batchwise_worker, args=(2, init, str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(os.path.join(tmp_path, f"rank{r}.pt")) for r in range(2)]
    assert (parts[0]["loss"] + parts[1]["loss"]).item() / 2 == pytest.approx(loss.item(), rel=1e-6)
    grad = torch.cat([p["grad"] / 2 for p in parts], dim=1)
    assert torch.allclose(grad, full.grad, atol=1e-7, rtol=1e-5)
    # the shared P matters: each half alone would give another loss
    alone = lorac_loss(views[:, :3], keys[:, :3], queues, **ARGS)
    assert abs(alone.item() - parts[0]["loss"].item()) > 1e-5
