"""Optimisers (LARS) and the parameter schedules (learning rate, beta) built from the config.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config` (the valid values of SOLVER.OPTIMIZER).
"""

from pretrain.solver.build import (
    LARS,
    BetaParamScheduler,
    build_lr_scheduler,
    build_optimizer,
    lr_multiplier,
)

__all__ = ["LARS", "BetaParamScheduler", "build_lr_scheduler", "build_optimizer", "lr_multiplier"]
