"""The meta-architecture registry (see the contract in ``pretrain.modeling``)."""

from __future__ import annotations

import torch
from fvcore.common.config import CfgNode
from fvcore.common.registry import Registry

from pretrain.config.step_policy import EAGER_STEP, StepPolicy

META_ARCH_REGISTRY = Registry("PRETRAIN_META_ARCH")
META_ARCH_REGISTRY.__doc__ = "Pretraining meta-architectures; see pretrain.modeling for the API."


def build_model(
    cfg: CfgNode, world_size: int = 1, policy: StepPolicy = EAGER_STEP
) -> torch.nn.Module:
    """Build ``cfg.MODEL.META_ARCHITECTURE`` on ``cfg.MODEL.DEVICE`` for the training step
    ``policy`` (the trainer's; the eager step's by default).

    The RNG is seeded with ``cfg.SEED`` first so every process (and a resumed run) starts from the
    same initial weights; the key encoder is copied from the query encoder before any norm
    conversion.
    """
    torch.manual_seed(cfg.SEED)
    cls = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE)
    model = cls(**cls.from_config(cfg, world_size=world_size, policy=policy))
    return model.to(torch.device(cfg.MODEL.DEVICE))
