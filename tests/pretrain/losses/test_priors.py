"""The prior registry (pretrain/losses/priors.py) and the losses' use of its contract.

The values of every prior are checked against independent implementations in test_losses.py and
test_multicrop_loss.py (by name); here: the registry's names and errors, that an instance and its
name give the same loss, and that the loss really calls the object it is given.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from pretrain.losses.lorac import PRIORS, lorac_loss
from pretrain.losses.priors import (
    PRIOR_REGISTRY,
    BatchwisePrior,
    ConstantPrior,
    GaussianPrior,
    LaplacePrior,
    NoPrior,
    Prior,
    build_prior,
    register_prior,
)


def _unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g), dim=-1)


def test_registry_holds_the_config_names():
    """LOSS.PRIOR's five values, in the order config errors list them, each its own class."""
    expected = {
        "laplace": LaplacePrior,
        "gaussian": GaussianPrior,
        "constant": ConstantPrior,
        "none": NoPrior,
        "batchwise": BatchwisePrior,
    }
    assert dict(PRIOR_REGISTRY) == expected
    assert tuple(expected) == PRIORS
    assert [n for n, cls in expected.items() if cls.batchwise] == ["batchwise"]
    assert [n for n, cls in expected.items() if not cls.enabled] == ["none"]
    assert [n for n, cls in expected.items() if not cls.reads_norm] == ["constant", "none"]


def test_build_prior_passes_each_prior_its_own_constants():
    assert build_prior("gaussian", c=1.0, c0=2.0, sigma2=3.0) == GaussianPrior(c0=2.0, sigma2=3.0)
    assert build_prior("constant", c=3.0, c0=None) == ConstantPrior(c=3.0)
    assert build_prior("laplace", c=3.0) == LaplacePrior()


@pytest.mark.parametrize(
    "name,kwargs,match",
    [
        ("cauchy", {}, "^prior must be one of"),
        ("constant", {}, "^c is required"),
        ("constant", {"c": math.nan}, "^c is required"),
        ("gaussian", {"sigma2": 1.0}, "^c0 is required"),
        ("gaussian", {"c0": 1.0, "sigma2": -1.0}, "^sigma2 must be > 0"),
    ],
)
def test_build_prior_errors_name_the_argument(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_prior(name, **kwargs)


@pytest.mark.parametrize("beta", [2.0, math.inf])
def test_every_prior_is_off_at_beta_inf_and_none_always(beta):
    for name, cls in PRIOR_REGISTRY:
        prior = build_prior(name, c=3.0, c0=1.0, sigma2=2.0)
        assert isinstance(prior, cls)
        assert prior.active(beta) == (name != "none" and math.isfinite(beta))


@pytest.mark.parametrize(
    "prior",
    [LaplacePrior(), GaussianPrior(c0=math.sqrt(5.0), sigma2=2.0), ConstantPrior(c=3.0),
     NoPrior(), BatchwisePrior()],
    ids=lambda p: p.name,
)  # fmt: skip
def test_an_instance_gives_the_loss_of_its_name(prior):
    views = _unit(8, 4, 12, seed=1).requires_grad_()
    keys, queues = _unit(2, 4, 12, seed=2), _unit(2, 20, 12, seed=3)
    args = dict(key_views=[0, 1], lowrank_views=[0, 1, 2], tau=0.2, beta=1.5)
    constants = {f.name: getattr(prior, f.name) for f in dataclasses.fields(prior)}
    by_name = lorac_loss(views, keys, queues, prior=prior.name, **constants, **args)
    by_object = lorac_loss(views, keys, queues, prior=prior, **args)
    (g_name,) = torch.autograd.grad(by_name, views)
    (g_object,) = torch.autograd.grad(by_object, views)
    assert by_object.item() == by_name.item()
    assert torch.equal(g_object, g_name)


@dataclasses.dataclass(frozen=True)
class _TwiceLaplace(Prior):
    """Not registered: the loss must use whatever object it is given."""

    name = "twice_laplace"

    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        return -2.0 * nuc / (rows * beta * tau)


@pytest.mark.parametrize(
    "shapes,layout",
    [((4, 1, 10), dict(key_views=[0], lowrank_views=[1, 2, 3])),  # one key crop
     ((5, 2, 6), dict(key_views=[0, 1], lowrank_views=[0, 1, 2]))],
    ids=["one_key_crop", "two_key_crops"],
)  # fmt: skip
def test_the_loss_calls_the_prior_object(shapes, layout):
    """log h = -2 ||Q||_* / (M beta tau) at beta is Laplace at beta / 2."""
    v, j, k = shapes
    views, keys, queues = _unit(v, 4, 8, seed=7), _unit(j, 4, 8, seed=8), _unit(j, k, 8, seed=9)
    args = dict(tau=0.2, **layout)
    ours = lorac_loss(views, keys, queues, beta=2.0, prior=_TwiceLaplace(), **args)
    laplace = lorac_loss(views, keys, queues, beta=1.0, prior="laplace", **args)
    assert ours.item() == pytest.approx(laplace.item(), rel=1e-6)
    plain = lorac_loss(views, keys, queues, beta=2.0, **args)
    assert ours.item() != pytest.approx(plain.item(), rel=1e-4)


def test_an_instance_with_constants_is_rejected():
    with pytest.raises(ValueError, match="LoracLoss: prior"):
        lorac_loss(
            _unit(4, 4, 8, seed=10), _unit(1, 4, 8, seed=11), _unit(1, 10, 8, seed=12),
            tau=0.2, beta=1.0, prior=ConstantPrior(c=3.0), c=2.0, lowrank_views=[1, 2, 3],
        )  # fmt: skip


def test_config_accepts_a_prior_registered_after_import(monkeypatch, tmp_path):
    """LOSS.PRIOR is checked against the registry when the config is validated, so a prior a
    user's module registers (after pretrain.losses.lorac was imported) is accepted, and an unknown
    name is still refused."""
    from pretrain.config.defaults import ConfigError, get_cfg, validate_cfg

    @dataclasses.dataclass(frozen=True)
    class HalfLaplace(LaplacePrior):
        name = "half_laplace"

    # fvcore's Registry has no unregister: the registration goes into a copy of its map, which
    # monkeypatch swaps back after the test (the one way to leave the registry as it was)
    monkeypatch.setattr(PRIOR_REGISTRY, "_obj_map", dict(PRIOR_REGISTRY))
    register_prior(HalfLaplace)  # as a user's module does
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(tmp_path)
    cfg.LOSS.PRIOR = "half_laplace"
    validate_cfg(cfg)
    cfg.LOSS.PRIOR = "not_a_prior"
    with pytest.raises(ConfigError, match="LOSS.PRIOR"):
        validate_cfg(cfg)
