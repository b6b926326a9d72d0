"""The pretraining config: defaults and validation (``defaults``), strict YAML loading with
``_BASE_`` (``strict``) and the shipped config files (``files``).

May import: :mod:`pretrain.utils`, :mod:`pretrain.losses` (to ask the prior registry).
"""

from pretrain.config.defaults import ConfigError, get_cfg, load_config, validate_cfg

__all__ = ["ConfigError", "get_cfg", "load_config", "validate_cfg"]
