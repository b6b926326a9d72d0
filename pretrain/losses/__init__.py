"""The method: LORAC's loss (``lorac``), the priors log h (``priors``) and the nuclear norm.

The loss has two faces over one implementation, importable from here as ``torch.nn``'s are: the
criterion :class:`LoracLoss` and the function :func:`lorac_loss`; beside them ``nuclear_norm``.

May import: :mod:`pretrain.utils.compiled` only (the compile guard; besides it torch, and
fvcore's ``Registry`` for the priors: this room is the method, free of config and engine).
"""

from pretrain.losses import lorac
from pretrain.losses.lorac import (
    LOWRANK_VIEW_SETS,
    PRIORS,
    Q_CONSTRUCTIONS,
    LoracLoss,
    LoracStats,
    lorac_loss,
    resolve_lowrank_views,
)
from pretrain.losses.nuclear import nuclear_norm
from pretrain.losses.priors import Prior, build_prior, prior_names, register_prior

__all__ = [
    *lorac.__all__,
    "Prior",
    "build_prior",
    "prior_names",
    "register_prior",
]
