"""Setting up a pretraining run from the command line (detectron2-style)."""

from __future__ import annotations

import logging

import torch
from detectron2.engine import default_argument_parser, default_setup

from pretrain.config import load_config

__all__ = ["argument_parser", "setup"]


def argument_parser(description: str):
    """detectron2's parser: --config-file, --num-gpus, --num-machines, --machine-rank,
    --dist-url, --resume, --eval-only, trailing KEY VALUE overrides."""
    p = default_argument_parser()
    p.description = description
    return p


def _normalise_opts(opts: list[str]) -> list[str]:
    # yacs parses values with literal_eval, which has no 'inf'; 1e999 evaluates to inf.
    return [{"inf": "1e999", "-inf": "-1e999"}.get(o, o) for o in opts]


def setup(args):
    """Load and validate the config, fall back to CPU without a GPU, dump config and env."""
    cfg = load_config(args.config_file, _normalise_opts(list(args.opts)))
    if cfg.MODEL.DEVICE == "cuda" and not torch.cuda.is_available():
        cfg.defrost()
        cfg.MODEL.DEVICE = "cpu"
        cfg.freeze()
        logging.getLogger("pretrain").warning("no CUDA device: MODEL.DEVICE set to cpu")
    default_setup(cfg, args)  # logging, seeds, cudnn; the trainer dumps config.yaml and env.txt
    return cfg
