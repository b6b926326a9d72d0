"""LARS update rule (apex LARC, clip=False) and the LR / beta schedules."""

from __future__ import annotations

import math

import pytest
import torch

from pretrain.config.defaults import get_cfg
from pretrain.solver.build import LARS, BetaParamScheduler, lr_multiplier


def _reference_lars_step(p, g, buf, lr, mom, wd, eta, eps=1e-8):
    """One LARC step written out for a single tensor."""
    pn, gn = p.norm().item(), g.norm().item()
    trust = eta * pn / (gn + wd * pn + eps) if pn > 0 and gn > 0 else 1.0
    d = trust * (g + wd * p)
    buf = d.clone() if buf is None else mom * buf + d
    return p - lr * buf, buf


def test_lars_matches_written_out_rule_over_several_steps():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(torch.zeros(5))  # zero norm: trust ratio 1
    opt = LARS([w, b], lr=0.7, momentum=0.9, weight_decay=1e-2, eta=0.001)
    ref = {"w": (w.detach().clone(), None), "b": (b.detach().clone(), None)}
    for step in range(4):
        gw, gb = torch.randn(5, 3), torch.randn(5)
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        ref["w"] = _reference_lars_step(ref["w"][0], gw, ref["w"][1], 0.7, 0.9, 1e-2, 0.001)
        ref["b"] = _reference_lars_step(ref["b"][0], gb, ref["b"][1], 0.7, 0.9, 1e-2, 0.001)
        assert torch.allclose(w, ref["w"][0], atol=1e-7), step
        assert torch.allclose(b, ref["b"][0], atol=1e-7), step


def test_lars_step_is_scale_invariant_in_the_gradient():
    """The trust ratio makes the step size independent of the gradient's scale (no wd)."""
    torch.manual_seed(1)
    p0 = torch.randn(10)
    g = torch.randn(10)
    outs = []
    for scale in (1e-3, 1e3):
        p = torch.nn.Parameter(p0.clone())
        p.grad = g * scale
        LARS([p], lr=1.0, momentum=0.0, weight_decay=0.0, eta=0.01).step()
        outs.append(p.detach())
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert (outs[0] - p0).norm().item() == pytest.approx(0.01 * p0.norm().item(), rel=1e-5)


def test_lars_rejects_bad_arguments():
    p = [torch.nn.Parameter(torch.ones(1))]
    with pytest.raises(ValueError, match="eta"):
        LARS(p, lr=0.1, eta=0.0)
    with pytest.raises(ValueError, match="lr"):
        LARS(p, lr=-0.1)


def test_cosine_from_base_to_final_with_warmup():
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR, cfg.SOLVER.FINAL_LR, cfg.SOLVER.WARMUP_EPOCHS = 1.8, 0.018, 0.0
    sched = lr_multiplier(cfg, max_iter=1000, iters_per_epoch=10)
    assert sched(0.0) == pytest.approx(1.0)
    assert sched(0.5) == pytest.approx((1 + 0.01) / 2, rel=1e-6)
    assert sched(1.0) == pytest.approx(0.01, rel=1e-6)
    cfg.SOLVER.WARMUP_EPOCHS = 10.0  # 100 of 1000 iterations
    sched = lr_multiplier(cfg, max_iter=1000, iters_per_epoch=10)
    assert sched(0.0) == pytest.approx(0.0, abs=1e-9)
    assert sched(0.05) == pytest.approx(0.5, rel=1e-6)
    assert sched(0.1) == pytest.approx(1.0, rel=1e-6)
    assert sched(1.0) == pytest.approx(0.01, rel=1e-6)


@pytest.mark.parametrize(
    ("inf_iters", "max_iter"), [(100, 1000), (0, 50), (500_450, 1_000_900), (7, 7)]
)
def test_beta_schedule_is_inf_then_beta(inf_iters, max_iter):
    """inf for exactly the first inf_iters iterations, also at IN-1K's 1.0M iterations (where
    fvcore's MultiStepParamScheduler would switch one iteration early)."""
    sched = BetaParamScheduler(4.0, inf_iters, max_iter)
    for it in {0, inf_iters - 1, inf_iters, inf_iters + 1, max_iter - 1}:
        if 0 <= it < max_iter:
            assert sched(it / max_iter) == (math.inf if it < inf_iters else 4.0), it
