"""Optimisers and the parameter schedules (learning rate, beta) for pretraining.

LARS is written here because the paper used SwAV's setting of apex's ``LARC`` (eta = 0.001,
``clip=False``, every parameter), and apex needs a CUDA build. solo-learn's LARS has LARC's rule
but comes with a whole framework; lightly's leaves groups without weight decay unadapted; VISSL's
uses Barlow Twins' trust ratio eta ||p|| / ||g + weight_decay p||.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from detectron2.solver import LRMultiplier
from fvcore.common.config import CfgNode
from fvcore.common.param_scheduler import (
    CompositeParamScheduler,
    CosineParamScheduler,
    LinearParamScheduler,
    ParamScheduler,
)

from pretrain.config.defaults import OPTIMIZERS
from pretrain.config.step_policy import EAGER_STEP, StepPolicy

__all__ = [
    "LARS",
    "BetaParamScheduler",
    "build_lr_scheduler",
    "build_optimizer",
    "lr_multiplier",
]


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose per-parameter step is scaled by a LARC trust ratio (no clipping).

    For each parameter p with gradient g (apex ``LARC(clip=False)`` semantics):
        local = eta * ||p|| / (||g|| + weight_decay * ||p|| + eps)  (1 if ||p|| or ||g|| is 0)
        d = local * (g + weight_decay * p)
        buf = momentum * buf + d;  p -= lr * buf
    Where ||g|| is 0 and ||p|| is not, apex (like solo-learn and lightly) adds no weight decay;
    here d = weight_decay * p (``tests/pretrain/solver/test_solver.py`` pins this rule).

    ``adapt=False`` (local = 1) is ``torch.optim.SGD`` with momentum and weight decay.
    ``device_lr=True`` (the static step) multiplies by a device copy of each group's float lr,
    so that a CUDA graph does not bake the lr in as a constant, without a host sync.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        eps: float = 1e-8,
        *,
        adapt: bool = True,
        device_lr: bool = False,
    ) -> None:
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if v < 0:
                raise ValueError(f"LARS: {name} must be >= 0, got {v}")
        if eta <= 0:
            raise ValueError(f"LARS: eta (trust coefficient) must be > 0, got {eta}")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
            "adapt": adapt,
        }
        self.device_lr = device_lr
        super().__init__(params, defaults)
        self._lr_tensors: dict[int, torch.Tensor] = {}  # group index -> its lr on the device

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # groups saved by torch.optim.SGD (the eager MoCo-v2)
            for key in ("eta", "eps", "adapt"):
                group.setdefault(key, self.defaults[key])

    def _lr(self, index: int, group: dict, like: torch.Tensor) -> float | torch.Tensor:
        """The group's lr: its float, or (``device_lr``) a device tensor holding it."""
        if not self.device_lr:
            return group["lr"]
        t = self._lr_tensors.get(index)
        if t is None or t.device != like.device:
            t = self._lr_tensors[index] = torch.zeros((), dtype=like.dtype, device=like.device)
        return t.fill_(group["lr"])  # a kernel argument: no host-to-device copy, no sync

    @torch.no_grad()
    def step(  # type: ignore[override]
        self, closure: Callable[[], float] | None = None
    ) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            wd = group["weight_decay"]
            d = torch._foreach_add(grads, params, alpha=wd) if wd else [g.clone() for g in grads]
            if group["adapt"]:
                torch._foreach_mul_(d, self._trust_ratios(params, grads, group))
            if all("momentum_buffer" in self.state[p] for p in params):
                bufs = [self.state[p]["momentum_buffer"] for p in params]
                # one launch each over all parameters (a per-parameter loop is 2 per parameter)
                torch._foreach_mul_(bufs, group["momentum"])
                torch._foreach_add_(bufs, d)
            else:  # the first step: the buffers start as d
                for p, di in zip(params, d, strict=True):
                    self.state[p]["momentum_buffer"] = di.clone()
                bufs = [self.state[p]["momentum_buffer"] for p in params]
            lr = self._lr(index, group, params[0])
            if isinstance(lr, torch.Tensor):
                torch._foreach_sub_(params, torch._foreach_mul(bufs, lr))
            else:
                torch._foreach_add_(params, bufs, alpha=-lr)
        return loss

    @staticmethod
    def _trust_ratios(
        params: list[torch.Tensor], grads: list[torch.Tensor], group: dict
    ) -> list[torch.Tensor]:
        """LARC's local learning rate of each parameter (0-d tensors)."""
        wd, eta, eps = group["weight_decay"], group["eta"], group["eps"]
        p_norm = torch.stack(torch._foreach_norm(params))
        g_norm = torch.stack(torch._foreach_norm(grads))
        trust = eta * p_norm / (g_norm + wd * p_norm + eps)
        trust = torch.where((p_norm > 0) & (g_norm > 0), trust, torch.ones_like(trust))
        return list(trust.unbind())


def build_optimizer(
    cfg: CfgNode, model: torch.nn.Module, policy: StepPolicy = EAGER_STEP
) -> torch.optim.Optimizer:
    """:class:`LARS` over the query encoder's parameters, with LARC's trust ratio (LORAC,
    MoCo-M) or without it (SGD: MoCo-v2), for the training step ``policy`` (the trainer's)."""
    params = [p for p in model.parameters() if p.requires_grad]
    s = cfg.SOLVER
    if s.OPTIMIZER not in OPTIMIZERS:
        raise ValueError(f"SOLVER.OPTIMIZER = {s.OPTIMIZER!r}: expected one of {OPTIMIZERS}")
    return LARS(
        params, lr=s.BASE_LR, momentum=s.MOMENTUM, weight_decay=s.WEIGHT_DECAY, eta=s.LARS_ETA,
        adapt=s.OPTIMIZER == "LARS", device_lr=policy.device_lr,
    )  # fmt: skip


def lr_multiplier(cfg: CfgNode, max_iter: int, iters_per_epoch: int) -> ParamScheduler:
    """Per-iteration multiplier of BASE_LR: optional linear warm-up, then cosine to FINAL_LR."""
    s = cfg.SOLVER
    final = s.FINAL_LR / s.BASE_LR
    warm = min(int(round(s.WARMUP_EPOCHS * iters_per_epoch)), max_iter - 1)
    if warm <= 0:
        return CosineParamScheduler(1.0, final)
    frac = warm / max_iter
    return CompositeParamScheduler(
        [LinearParamScheduler(0.0, 1.0), CosineParamScheduler(1.0, final)],
        interval_scaling=["rescaled", "rescaled"],
        lengths=[frac, 1.0 - frac],
    )


def build_lr_scheduler(
    cfg: CfgNode, optimizer: torch.optim.Optimizer, max_iter: int, iters_per_epoch: int
) -> LRMultiplier:
    """detectron2's ``LRMultiplier`` over :func:`lr_multiplier`, stepped once per iteration."""
    return LRMultiplier(optimizer, lr_multiplier(cfg, max_iter, iters_per_epoch), max_iter)


class BetaParamScheduler(ParamScheduler):
    """The prior's beta over training: inf (prior off) for the first ``inf_fraction`` of the
    iterations, then ``beta`` (the paper's warm-up, Sec. 6.2 and Fig. 3).

    Not fvcore's ``MultiStepParamScheduler``: its ``WHERE_EPSILON`` (1e-6) moves the switch one
    iteration early from 1M iterations on (IN-1K at batch 256 has 1.0M).
    """

    def __init__(self, beta: float, inf_iters: int, max_iter: int) -> None:
        self.beta = float(beta)
        self.inf_fraction = int(inf_iters) / int(max_iter)

    def __call__(self, where: float) -> float:
        return math.inf if where < self.inf_fraction else self.beta
