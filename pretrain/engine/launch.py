"""Setting up a pretraining run from the command line (detectron2-style)."""

from __future__ import annotations

import argparse

import torch
from detectron2.engine import default_argument_parser
from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.cluster.distributed import maybe_init_distributed
from pretrain.config.defaults import ConfigError, load_config
from pretrain.utils.locks import DirLock
from pretrain.utils.run_setup import setup_run

__all__ = ["argument_parser", "check_device", "load_args_config", "setup"]


def argument_parser(description: str) -> argparse.ArgumentParser:
    """detectron2's parser: --config-file, --num-gpus, --num-machines, --machine-rank,
    --dist-url, --resume, --eval-only, trailing KEY VALUE overrides."""
    p = default_argument_parser()
    p.description = description
    return p


def _normalise_opts(opts: list[str]) -> list[str]:
    # yacs parses values with literal_eval, which has no 'inf'; 1e999 evaluates to inf.
    return [{"inf": "1e999", "-inf": "-1e999"}.get(o, o) for o in opts]


def load_args_config(args: argparse.Namespace) -> CfgNode:
    """The validated, frozen config of ``--config-file`` and the trailing overrides."""
    return load_config(args.config_file, _normalise_opts(list(args.opts)))


def check_device(device: str) -> None:
    """Refuse ``MODEL.DEVICE cuda`` where no CUDA device is visible.

    A GPU job that lands on a node without a working GPU (a driver fault, a wrong
    ``CUDA_VISIBLE_DEVICES``) must stop, not train for days on CPU at a hundredth of the speed.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "MODEL.DEVICE = 'cuda' but CUDA is not visible to this process (no GPU, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them): run where a GPU is visible, or set MODEL.DEVICE "
            "cpu to train on the CPU"
        )


def setup(args: argparse.Namespace) -> CfgNode:
    """Load and validate the config, refuse CUDA where none is visible, join the process group,
    hold OUTPUT_DIR (main process), set up logs and seeds."""
    cfg = load_args_config(args)
    check_device(cfg.MODEL.DEVICE)
    # under torchrun or srun (one process per task): join the process group from their variables
    maybe_init_distributed(cfg.MODEL.DEVICE, timeout_min=cfg.DIST.TIMEOUT_MINUTES)
    if comm.is_main_process():
        # before the first log line goes to OUTPUT_DIR/log.txt: a second run into a directory a
        # live run holds stops here having written nothing; held until this process ends (the
        # trainer takes it again for its own lifetime, for runs built without this setup)
        DirLock(cfg.OUTPUT_DIR).acquire()
    # logging, seeds, cudnn; PretrainTrainer dumps config.yaml and env.txt (once per run: it also
    # runs without this setup, in the demo and the study)
    setup_run(cfg, args, dump=False)
    return cfg
