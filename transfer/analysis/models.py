"""Load a pretrained ``MultiViewMoCo``, strictly, from a run directory (its ``config.yaml`` and
last checkpoint) or a checkpoint file with ``config.yaml`` beside it: the config rebuilds the
model and reproduces the run's own augmentation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from fvcore.common.config import CfgNode

from pretrain.config.defaults import load_config
from transfer.analysis import AnalysisError
from transfer.analysis.runs import prior_never_on
from transfer.checkpoint.layouts import find_matches
from transfer.checkpoint.provenance import run_label
from transfer.checkpoint.reader import load_checkpoint_file
from transfer.metrics_json import read_metrics_json

__all__ = ["PretrainedModel", "load_pretrained", "resolve_run"]


@dataclass
class PretrainedModel:
    label: str
    checkpoint: str
    config_path: str
    cfg: CfgNode  # the run's frozen CfgNode (MODEL.DEVICE set to the analysis device)
    model: torch.nn.Module
    prior_never_on: bool = False  # these weights trained with beta = inf throughout

    @property
    def beta(self) -> float:
        """The prior's final beta; inf when the prior is off (MoCo-M / MoCo-v2)."""
        return math.inf if self.prior == "none" else float(self.cfg.LOSS.BETA)

    @property
    def prior(self) -> str:
        return str(self.cfg.LOSS.PRIOR)


def resolve_run(path: str) -> tuple[str, str]:
    """``(checkpoint, config.yaml)`` for a run directory or a checkpoint file."""
    if os.path.isdir(path):
        config = os.path.join(path, "config.yaml")
        pointer = os.path.join(path, "last_checkpoint")
        if os.path.isfile(pointer):
            with open(pointer) as f:
                name = f.read().strip()
            ckpt = os.path.join(path, name)
            if not name or not os.path.isfile(ckpt):
                raise AnalysisError(f"{pointer}: names {name!r}, which is not a file in {path}")
        else:
            ckpt = os.path.join(path, "model_final.pth")
            if not os.path.isfile(ckpt):
                raise AnalysisError(f"{path}: no last_checkpoint or model_final.pth in this run")
    elif os.path.isfile(path):
        ckpt, config = path, os.path.join(os.path.dirname(os.path.abspath(path)), "config.yaml")
    else:
        raise AnalysisError(f"{path}: no such run directory or checkpoint file")
    if not os.path.isfile(config):
        raise AnalysisError(
            f"{path}: no config.yaml in {os.path.dirname(os.path.abspath(ckpt))} (needed to "
            "rebuild the model and its augmentation)"
        )
    return ckpt, config


def load_pretrained(path: str, label: str = "", device: str = "cpu") -> PretrainedModel:
    """Build the run's model on ``device`` ("cpu" or "cuda") and load its weights strictly."""
    from pretrain.modeling import build_model

    ckpt_path, config_path = resolve_run(path)
    cfg = load_config(config_path, ["MODEL.DEVICE", device])
    obj = load_checkpoint_file(ckpt_path)
    state = obj.get("model")
    if not isinstance(state, dict) or not any(k.startswith("encoder_q.") for k in state):
        # A release of another method holds a backbone only; say which, and where it does work.
        layouts = [m.layout.name for m in find_matches(obj)]
        kind = f"a {'/'.join(layouts)}-layout backbone" if layouts else "no LORAC model"
        raise AnalysisError(
            f"{ckpt_path}: {kind} (top-level keys {sorted(map(str, obj))[:6]}); this analysis "
            "needs a LORAC run's full model (projection head) and config.yaml; evaluate other "
            "checkpoints with tools/knn_eval.py or tools/linear_probe.py"
        )
    model = build_model(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        why = " ".join(str(e).split())  # torch's message spans many lines
        raise AnalysisError(
            f"{ckpt_path}: weights do not fit the model of {config_path}: {why[:400]}"
        ) from None
    model.eval()
    never_on = prior_never_on(cfg, _logged_betas(config_path, obj.get("iteration")))
    return PretrainedModel(label or run_label(path), ckpt_path, config_path, cfg, model, never_on)


def _logged_betas(config_path: str, iteration: object) -> list[float]:
    """The betas the run beside ``config_path`` logged (its ``metrics.json``) up to the
    checkpoint's ``iteration`` (all when the checkpoint does not say); [] without a log."""
    metrics = os.path.join(os.path.dirname(config_path), "metrics.json")
    if not os.path.isfile(metrics):
        return []
    last = iteration if isinstance(iteration, int) else math.inf
    return [
        float(r["beta"])
        for r in read_metrics_json(metrics)
        if isinstance(r.get("beta"), (int, float)) and r["iteration"] <= last
    ]
