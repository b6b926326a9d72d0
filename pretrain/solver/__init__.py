"""Optimisers (LARS) and learning-rate schedules built from the config.

May import: :mod:`pretrain.utils`.
"""

from pretrain.solver.build import LARS, build_lr_scheduler, build_optimizer, lr_multiplier

__all__ = ["LARS", "build_lr_scheduler", "build_optimizer", "lr_multiplier"]
