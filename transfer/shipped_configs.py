"""Where the shipped configs are: the top-level ``configs/`` directory, installed as the package
``lorac_configs`` (package data, see setup.py), so that editable and regular installs alike find
them without knowing where the repository is."""

from __future__ import annotations

from importlib.resources import files

__all__ = ["config_path"]


def config_path(name: str = "") -> str:
    """Path of the shipped config ``name`` relative to ``configs/`` (e.g.
    ``"pretrain/demo_fashion_mnist_r18.yaml"``); without a name, the ``configs/`` directory.

    The files are plain files on disk (the package is never zipped), so the ``_BASE_`` paths
    inside them resolve relative to the returned path as usual."""
    try:
        root = files("lorac_configs")
    except ModuleNotFoundError:
        # An install made before configs/ became package data: say how to fix it.
        raise ModuleNotFoundError(
            "lorac_configs (the configs/ directory) is not installed: run `pip install -e .` "
            "(or `make venv`) again",
            name="lorac_configs",
        ) from None
    return str(root.joinpath(*name.split("/") if name else ()))
