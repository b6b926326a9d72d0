"""The shipped YAML configs, installed as the package ``lorac_configs`` (setup.py) so that the
library finds them with :func:`transfer.shipped_configs.config_path`. Holds no code."""
