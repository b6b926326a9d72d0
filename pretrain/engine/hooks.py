"""Training hooks specific to momentum-contrast pretraining."""

from __future__ import annotations

import logging
import math

from detectron2.engine import HookBase
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["BetaSchedule", "MomentumUpdate", "beta_at", "unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper, or ``model`` itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def beta_at(iteration: int, beta: float, inf_iters: int) -> float:
    """The paper's step schedule: beta = inf for the first ``inf_iters`` iterations."""
    return math.inf if iteration < inf_iters else beta


class BetaSchedule(HookBase):
    """Sets the model's beta before every step (stateless: a function of the iteration)."""

    def __init__(self, beta: float, inf_iters: int) -> None:
        self.beta, self.inf_iters = float(beta), int(inf_iters)
        self._last: float | None = None

    def before_step(self) -> None:
        b = beta_at(self.trainer.iter, self.beta, self.inf_iters)
        unwrap(self.trainer.model).set_beta(b)
        if b != self._last:
            logging.getLogger(__name__).info(f"iteration {self.trainer.iter}: beta = {b}")
            self._last = b


class MomentumUpdate(HookBase):
    """theta_k <- m theta_k + (1 - m) theta_q after every optimiser step.

    MoCo does this at the start of the next forward; doing it after the step is identical and
    keeps the key encoder of a checkpoint consistent with its query encoder.
    """

    def after_step(self) -> None:
        unwrap(self.trainer.model).momentum_update()
