"""Setting up a pretraining run from the command line (detectron2-style)."""

from __future__ import annotations

import argparse
import logging

import torch
from detectron2.engine import default_argument_parser
from fvcore.common.config import CfgNode

from pretrain.cluster.distributed import maybe_init_distributed
from pretrain.config.defaults import load_config
from pretrain.utils.run_setup import setup_run

__all__ = ["argument_parser", "setup"]


def argument_parser(description: str) -> argparse.ArgumentParser:
    """detectron2's parser: --config-file, --num-gpus, --num-machines, --machine-rank,
    --dist-url, --resume, --eval-only, trailing KEY VALUE overrides."""
    p = default_argument_parser()
    p.description = description
    return p


def _normalise_opts(opts: list[str]) -> list[str]:
    # yacs parses values with literal_eval, which has no 'inf'; 1e999 evaluates to inf.
    return [{"inf": "1e999", "-inf": "-1e999"}.get(o, o) for o in opts]


def setup(args: argparse.Namespace) -> CfgNode:
    """Load and validate the config, fall back to CPU without a GPU, set up logs and seeds."""
    cfg = load_config(args.config_file, _normalise_opts(list(args.opts)))
    if cfg.MODEL.DEVICE == "cuda" and not torch.cuda.is_available():
        cfg.defrost()
        cfg.MODEL.DEVICE = "cpu"
        cfg.freeze()
        logging.getLogger("pretrain").warning("no CUDA device: MODEL.DEVICE set to cpu")
    # under torchrun or srun (one process per task): join the process group from their variables
    maybe_init_distributed(cfg.MODEL.DEVICE)
    # logging, seeds, cudnn; PretrainTrainer dumps config.yaml and env.txt (once per run: it also
    # runs without this setup, in the demo and the study)
    setup_run(cfg, args, dump=False)
    return cfg
