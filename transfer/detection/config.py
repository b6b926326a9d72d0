"""Load detectron2 YAML configs strictly, with errors that name the key and the file.

The project adds no config keys: its configs are plain detectron2 YAML. detectron2 already refuses
unknown keys; this module only turns its bare ``KeyError``/``AssertionError`` into a
:class:`DetectionSetupError` that says which file (following the ``_BASE_`` chain) or command-line
option holds the bad key, and adapts ``SyncBN`` for multi-process CPU runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import yaml
from detectron2.config import CfgNode, get_cfg

from pretrain.errors import LoracError

__all__ = ["DetectionSetupError", "load_config", "use_naive_syncbn_on_cpu"]

_KEY_IN_MESSAGE = re.compile(r"(?:config key|key|Key):? ([A-Za-z0-9_.]+)")


class DetectionSetupError(LoracError):
    """A config, dataset or weights problem found before training; the message is one line."""


def _base_chain(config_file: str) -> list[str]:
    """``config_file`` followed by its ``_BASE_`` files, nearest first (unreadable ones skipped)."""
    chain, current = [], config_file
    while current and os.path.isfile(current) and current not in chain:
        chain.append(current)
        with open(current) as f:
            data = yaml.safe_load(f) or {}
        base = data.get("_BASE_") if isinstance(data, dict) else None
        current = os.path.join(os.path.dirname(current), base) if base else None
    return chain


def _file_defining(config_file: str, full_key: str) -> str:
    """The file of the ``_BASE_`` chain that sets ``full_key``; ``config_file`` if none does."""
    for path in _base_chain(config_file):
        with open(path) as f:
            node = yaml.safe_load(f) or {}
        for part in full_key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return path
    return config_file


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if e.args else type(e).__name__
    return " ".join(text.split())


def load_config(config_file: str, opts: Sequence[str] = ()) -> CfgNode:
    """detectron2's ``get_cfg()`` merged with ``config_file`` and ``KEY VALUE`` ``opts``.

    Raises :class:`DetectionSetupError` naming the file and key for unknown keys, type
    mismatches or unreadable files.
    """
    if not os.path.isfile(config_file):
        raise DetectionSetupError(f"{config_file}: no such config file")
    cfg = get_cfg()
    try:
        cfg.merge_from_file(config_file)
    except (KeyError, ValueError, AssertionError, OSError, yaml.YAMLError) as e:
        msg = _one_line(e)
        m = _KEY_IN_MESSAGE.search(msg)
        where = _file_defining(config_file, m.group(1)) if m else config_file
        raise DetectionSetupError(f"{where}: {msg}") from None
    try:
        cfg.merge_from_list(list(opts))
    except (KeyError, ValueError, AssertionError) as e:
        raise DetectionSetupError(f"command-line config options: {_one_line(e)}") from None
    return cfg


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
