"""detectron2 configs for detection, loaded by the project's one strict loader.

The project adds no config keys: its configs are plain detectron2 YAML, loaded by
:func:`pretrain.config.strict.load_strict` on top of detectron2's ``get_cfg()``, so an unknown key,
a
type mismatch or an unreadable file raises :class:`~pretrain.utils.errors.ConfigError` naming the
file
(following the ``_BASE_`` chain) or command-line option that holds it. This module also adapts
``SyncBN`` for multi-process CPU runs. :class:`DetectionSetupError` is left for the other problems
found before training: datasets and weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from detectron2.config import CfgNode, get_cfg

from pretrain.config.strict import load_strict
from pretrain.utils.errors import ConfigError, LoracError

__all__ = ["DetectionSetupError", "load_config", "use_naive_syncbn_on_cpu"]


class DetectionSetupError(LoracError):
    """A dataset or weights problem found before training; the message is one line."""


def load_config(config_file: str, opts: Sequence[str] = ()) -> CfgNode:
    """detectron2's ``get_cfg()`` merged with ``config_file`` and ``KEY VALUE`` ``opts``
    (not frozen: the trainer adapts it first).

    Raises :class:`ConfigError` naming the file and key for unknown keys, type mismatches or
    unreadable files.
    """
    if not config_file:
        raise ConfigError("no config file given (--config-file)")
    return load_strict(get_cfg(), config_file, opts)


def use_naive_syncbn_on_cpu(cfg: CfgNode, world_size: int) -> list[str]:
    """Replace ``SyncBN`` by detectron2's ``naiveSyncBN`` in every ``*.NORM`` key when ``cfg``
    runs on CPU with more than one process (torch's SyncBatchNorm refuses CPU tensors then).

    ``cfg`` must be mutable; returns the full names of the keys changed, for the caller to log.
    """
    if world_size <= 1 or cfg.MODEL.DEVICE != "cpu":
        return []
    changed: list[str] = []

    def visit(node: CfgNode, path: str) -> None:
        for key, value in node.items():
            if isinstance(value, CfgNode):
                visit(value, f"{path}{key}.")
            elif key == "NORM" and value == "SyncBN":
                node[key] = "naiveSyncBN"
                changed.append(path + key)

    visit(cfg, "")
    return sorted(changed)
