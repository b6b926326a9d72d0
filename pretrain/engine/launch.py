"""Setting up a pretraining run from the command line (detectron2-style)."""

from __future__ import annotations

import argparse
import logging

import torch
from detectron2.config import CfgNode as D2CfgNode
from detectron2.engine import default_argument_parser, default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from fvcore.common.config import CfgNode

from pretrain.cluster.distributed import maybe_init_distributed
from pretrain.config import load_config

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
    """Load and validate the config, fall back to CPU without a GPU, dump config and env."""
    cfg = load_config(args.config_file, _normalise_opts(list(args.opts)))
    if cfg.MODEL.DEVICE == "cuda" and not torch.cuda.is_available():
        cfg.defrost()
        cfg.MODEL.DEVICE = "cpu"
        cfg.freeze()
        logging.getLogger("pretrain").warning("no CUDA device: MODEL.DEVICE set to cpu")
    # under torchrun or srun (one process per task): join the process group from their variables
    maybe_init_distributed(cfg.MODEL.DEVICE)
    # logging, seeds, cudnn; the trainer dumps config.yaml and env.txt. default_setup reads keys
    # through OmegaConf unless it gets detectron2's CfgNode (fvcore's fails in OmegaConf.select).
    default_setup(D2CfgNode(cfg), args)
    # this package's own loggers (resume, preemption) to the console of rank 0 and log.txt
    setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="pretrain")
    return cfg
