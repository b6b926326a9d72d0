"""The meta-architecture registry (see the contract in ``pretrain.modeling``)."""

from __future__ import annotations

import torch
from fvcore.common.registry import Registry

META_ARCH_REGISTRY = Registry("PRETRAIN_META_ARCH")
META_ARCH_REGISTRY.__doc__ = "Pretraining meta-architectures; see pretrain.modeling for the API."


def build_model(cfg, world_size: int = 1) -> torch.nn.Module:
    """Build ``cfg.MODEL.META_ARCHITECTURE`` on ``cfg.MODEL.DEVICE``.

    The RNG is seeded with ``cfg.SEED`` first so every process (and a resumed run) starts from the
    same initial weights; the key encoder is copied from the query encoder before any norm
    conversion.
    """
    torch.manual_seed(cfg.SEED)
    cls = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE)
    model = cls(**cls.from_config(cfg, world_size=world_size))
    if cfg.MODEL.STEM != "imagenet":
        _replace_stem(model, cfg.MODEL.STEM)
    return model.to(torch.device(cfg.MODEL.DEVICE))


def _replace_stem(model: torch.nn.Module, stem: str) -> None:
    """Give both encoders of a built model ``stem`` (see ``pretrain.modeling.encoder.STEMS``).

    Done after construction so the meta-architecture's signature is unchanged; the new conv1 is
    drawn from the same seeded RNG and copied to the (frozen) key encoder, as the constructor
    copies everything else. Only the stem's conv1 changes, so a norm conversion done by the
    constructor is untouched.
    """
    from pretrain.modeling.encoder import set_stem

    q, k = model.encoder_q.backbone, model.encoder_k.backbone
    set_stem(q, stem)
    set_stem(k, stem)
    k.conv1.load_state_dict(q.conv1.state_dict())
    for p in k.conv1.parameters():
        p.requires_grad_(False)
