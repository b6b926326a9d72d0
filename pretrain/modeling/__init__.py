"""Pretraining models, built through one fvcore registry.

Contract of ``META_ARCH_REGISTRY``: an entry is an ``nn.Module`` class with a classmethod
``from_config(cfg, world_size, policy) -> kwargs`` (``policy``: the training step's
:class:`~pretrain.config.step_policy.StepPolicy`, built by the trainer) and
``forward(batch) -> dict`` where keys starting with ``loss`` are scalar tensors to be summed and
back-propagated and ``metrics`` maps names to floats or 0-d tensors to log (tensors are read
on the host at the logging period only).
It also provides ``momentum_update()`` and ``set_beta(beta)``, called by the trainer's hooks.
``batch["views"]`` arrives augmented and normalised (float), on the model's device: the trainer
runs the data path's last step (:func:`pretrain.data.loader.augment_views_on_device`) first, so
models import nothing from :mod:`pretrain.data`.

May import: :mod:`pretrain.losses`, :mod:`pretrain.utils`, :mod:`pretrain.config` (the valid values
of MODEL.STEM and MODEL.NORM).
"""

from pretrain.modeling.build import META_ARCH_REGISTRY, build_model
from pretrain.modeling.meta_arch import MultiViewMoCo

__all__ = ["META_ARCH_REGISTRY", "MultiViewMoCo", "build_model"]
