"""What a checkpoint's path and its run directory say about the model: the run's name and the
pretraining method its config names. The results tables name their rows with these.

A pretraining run (``OUTPUT_DIR``) holds ``model_final.pth``, periodic ``model_0000999.pth`` files
and the ``config.yaml`` every run dumps (:mod:`pretrain.utils.run_setup`). Every run's final
checkpoint has the same file name, so a checkpoint is named after its run directory, not its file.

No torch here: ``tools/collect_detection_results.py`` names its rows without importing it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from pretrain.utils.errors import LoracError
from pretrain.utils.yaml_files import read_yaml

__all__ = ["checkpoint_method", "method_of", "run_label"]

FINAL_CHECKPOINT = "model_final"
# fvcore's Checkpointer names: model_final and model_<7-digit iteration>
_RUN_CHECKPOINT = re.compile(r"^model_(final|\d+)$")
# The names of paper Table 5 (tab:epochsHq) for the priors of LOSS.PRIOR.
_PRIOR_METHODS = {
    "laplace": "LORAC",
    "gaussian": "Gauss.",
    "batchwise": "LORAC-bs",
    "constant": "L-sftmx-c",
}


def run_label(path: str) -> str:
    """A model's name from its path: a run directory's name; for a checkpoint a run wrote
    (``model_final.pth``, ``model_0000999.pth``), its run directory's name (``run/model_0000999``
    for a periodic one); for any other file, its name without the extension."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return os.path.basename(path.rstrip(os.sep))
    name = os.path.basename(path)
    stem = name[: -len(".pth.tar")] if name.endswith(".pth.tar") else os.path.splitext(name)[0]
    if not _RUN_CHECKPOINT.match(stem):
        return stem
    run = os.path.basename(os.path.dirname(path))
    return run if stem == FINAL_CHECKPOINT else f"{run}/{stem}"


def _number(value: object) -> float:
    try:
        return float(value)  # yaml reads ".inf" as a float, a quoted "inf" as a string
    except (TypeError, ValueError):
        return math.nan


def method_of(cfg: Mapping) -> str:
    """The method a pretraining config (a ``CfgNode`` or the plain dict of its ``config.yaml``)
    trains, by the paper's names: LORAC, Gauss., LORAC-bs, L-sftmx-c, MoCo-M (no prior: prior
    ``none`` or beta = inf) or MoCo-v2 (no prior, two views, one key crop); ``""`` when
    ``cfg`` is not a pretraining config."""
    try:
        loss, views = cfg["LOSS"], cfg["INPUT"]
        prior = str(loss["PRIOR"])
        crops = int(views["LARGE_CROPS"]) + int(views["SMALL_CROPS"])
        keys = int(views["KEY_CROPS"])
    except (KeyError, TypeError, ValueError):
        return ""
    if prior != "none" and not math.isinf(_number(loss.get("BETA", 1.0))):
        return _PRIOR_METHODS.get(prior, prior)
    return "MoCo-v2" if crops == 2 and keys == 1 else "MoCo-M"


def checkpoint_method(path: str) -> str:
    """:func:`method_of` the ``config.yaml`` beside checkpoint ``path`` (its run directory);
    ``""`` when there is none or it is not a readable pretraining config (a downloaded release,
    a classification or detection run)."""
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "config.yaml")
    if not os.path.isfile(config):
        return ""
    try:
        cfg = read_yaml(config, "run config")
    except LoracError:
        return ""
    return method_of(cfg) if isinstance(cfg, Mapping) else ""
