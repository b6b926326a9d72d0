"""The priors h(Q) of LORAC's loss (paper Eq. 11 and 14, and the ablations), one class each.

Contract of ``PRIOR_REGISTRY`` (``LOSS.PRIOR`` names an entry): an entry is a frozen-dataclass
subclass of :class:`Prior` registered under its ``name``, whose fields are its constants,
validated with a ``ValueError`` naming the constant. The loss builds the matrix (one Q per
instance, or one P of Eq. (15) when ``batchwise``) and calls :meth:`Prior.log_h` with its nuclear
norm and M; beta is an argument because it follows a schedule. Every prior is off while
beta = inf (the warm-up): see :meth:`Prior.active`.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from typing import ClassVar, TypeVar

import torch
from fvcore.common.registry import Registry

__all__ = [
    "PRIOR_REGISTRY",
    "BatchwisePrior",
    "ConstantPrior",
    "GaussianPrior",
    "LaplacePrior",
    "NoPrior",
    "Prior",
    "build_prior",
    "prior_names",
    "register_prior",
]

PRIOR_REGISTRY = Registry("LORAC_PRIOR")
PRIOR_REGISTRY.__doc__ = (
    "Priors h(Q) of the LORAC loss; see pretrain.losses.priors for the contract."
)

_P = TypeVar("_P", bound="type[Prior]")


def register_prior(cls: _P) -> _P:
    """Register ``cls`` under ``cls.name``."""
    # fvcore's register() keys by __name__; LOSS.PRIOR's names are the paper's lowercase words.
    PRIOR_REGISTRY._do_register(cls.name, cls)
    return cls


@dataclasses.dataclass(frozen=True)
class Prior(ABC):
    """log h of a matrix with ``rows`` rows and nuclear norm ``nuc`` (see the module contract)."""

    name: ClassVar[str]
    batchwise: ClassVar[bool] = False  # one P over the global batch (Eq. 15), not a Q per instance
    reads_norm: ClassVar[bool] = True  # log h depends on the nuclear norm (gradients flow through)
    enabled: ClassVar[bool] = True  # False: no prior at any beta (MoCo-M)

    def active(self, beta: float) -> bool:
        """Whether log h enters the logits at this beta (beta = inf switches every prior off)."""
        return self.enabled and not math.isinf(beta)

    @abstractmethod
    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        """log h, same shape as ``nuc`` (float32); called only when :meth:`active`."""


def _require(ok: bool, name: str, msg: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {msg}, got {value!r}")


@register_prior
@dataclasses.dataclass(frozen=True)
class LaplacePrior(Prior):
    """LORAC, Eq. (11): log h(Q) = -||Q||_* / (M beta tau)."""

    name: ClassVar[str] = "laplace"

    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        return -nuc / (rows * beta * tau)


@register_prior
@dataclasses.dataclass(frozen=True)
class GaussianPrior(Prior):
    """Ablation: log h(Q) = -(||Q||_* - c0)^2 / (sigma2 M tau); a finite beta is ignored."""

    name: ClassVar[str] = "gaussian"
    c0: float
    sigma2: float

    def __post_init__(self) -> None:
        ok = self.c0 is not None and math.isfinite(self.c0)
        _require(ok, "c0", "is required by prior 'gaussian' (a finite number)", self.c0)
        ok = self.sigma2 is not None and self.sigma2 > 0
        _require(ok, "sigma2", "must be > 0 for prior 'gaussian'", self.sigma2)

    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        return -((nuc - self.c0) ** 2) / (self.sigma2 * rows * tau)


@register_prior
@dataclasses.dataclass(frozen=True)
class ConstantPrior(Prior):
    """L-sftmx-c: log h = -c / (M beta tau), the same margin for every instance."""

    name: ClassVar[str] = "constant"
    reads_norm: ClassVar[bool] = False
    c: float

    def __post_init__(self) -> None:
        ok = self.c is not None and math.isfinite(self.c)
        _require(ok, "c", "is required by prior 'constant' (a finite number)", self.c)

    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        return torch.full_like(nuc, -self.c / (rows * beta * tau))


@register_prior
@dataclasses.dataclass(frozen=True)
class NoPrior(Prior):
    """MoCo-M: no prior, log h = 0 (the loss is multi-query InfoNCE)."""

    name: ClassVar[str] = "none"
    reads_norm: ClassVar[bool] = False
    enabled: ClassVar[bool] = False

    def log_h(self, nuc: torch.Tensor, rows: int, *, tau: float, beta: float) -> torch.Tensor:
        return torch.zeros_like(nuc)


@register_prior
@dataclasses.dataclass(frozen=True)
class BatchwisePrior(LaplacePrior):
    """LORAC-bs, Eq. (15): the Laplace form on P, every instance's prior views centred on their
    mean, shared by the whole (global) batch; M is the number of rows of P."""

    name: ClassVar[str] = "batchwise"
    batchwise: ClassVar[bool] = True


def prior_names() -> tuple[str, ...]:
    """The registered prior names, in registration order."""
    return tuple(name for name, _ in PRIOR_REGISTRY)


def build_prior(
    name: str, *, c: float | None = None, c0: float | None = None, sigma2: float | None = None
) -> Prior:
    """The prior registered as ``name``, given the constants it declares (others are ignored);
    ValueError for an unknown name or a missing or invalid constant."""
    if name not in PRIOR_REGISTRY:
        raise ValueError(f"prior must be one of {prior_names()}, got {name!r}")
    cls = PRIOR_REGISTRY.get(name)
    given = {"c": c, "c0": c0, "sigma2": sigma2}
    return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})
