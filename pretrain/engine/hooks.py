"""Training hooks specific to momentum-contrast pretraining."""

from __future__ import annotations

import logging

from detectron2.engine import HookBase
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["BetaSchedule", "MomentumUpdate", "unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper, or ``model`` itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class BetaSchedule(HookBase):
    """Sets the model's beta from a ``ParamScheduler`` before every step, as detectron2's
    ``LRScheduler`` hook does for the learning rate (stateless: a function of the iteration)."""

    def __init__(self, scheduler: ParamScheduler, max_iter: int) -> None:
        self.scheduler, self.max_iter = scheduler, int(max_iter)
        self._last: float | None = None

    def before_step(self) -> None:
        b = self.scheduler(self.trainer.iter / self.max_iter)
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
