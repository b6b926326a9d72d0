"""The method: LORAC's loss (``lorac``), the priors log h (``priors``) and the nuclear norm.

The functional API (``lorac_loss``, ``multicrop_lorac_loss``, their ``_with_stats`` forms,
``log_prior``, ``nuclear_norm``) is importable from here, as ``torch.nn.functional`` is.

May import: torch only (this room is the method, free of config and engine).
"""

from pretrain.losses import lorac
from pretrain.losses.lorac import (
    PRIORS,
    Q_CONSTRUCTIONS,
    LoracStats,
    log_prior,
    lorac_loss,
    lorac_loss_with_stats,
    multicrop_lorac_loss,
    multicrop_lorac_loss_with_stats,
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
