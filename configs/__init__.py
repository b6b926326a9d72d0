"""The shipped YAML configs, installed as the package ``lorac_configs`` (setup.py) so that the
library finds them with :func:`pretrain.config.files.config_path`. Holds no code."""
