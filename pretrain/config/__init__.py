"""The pretraining config: defaults and validation (``defaults``), strict YAML loading with
``_BASE_`` (``strict``).

May import: :mod:`pretrain.utils`, :mod:`pretrain.losses` (to check prior, Q construction and
low-rank view names against the method's own lists).
"""

from pretrain.config.defaults import ConfigError, get_cfg, load_config, validate_cfg

__all__ = ["ConfigError", "get_cfg", "load_config", "validate_cfg"]
