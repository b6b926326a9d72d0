"""Setting up a run: its loggers, seeds, and its full config and environment on disk, once.

Every run leaves in its output directory ``config.yaml`` (the full, merged config), ``env.txt``
and, for tools configured by arguments only, ``args.json``: :func:`dump_run_info` is their one
writer. :func:`setup_run` is detectron2's ``default_setup`` for any ``CfgNode``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping

import torch
from fvcore.common.config import CfgNode

from pretrain.utils.atomic_io import atomic_write_bytes

__all__ = ["CONFIG_FILE", "ENV_FILE", "dump_run_info", "setup_run"]

CONFIG_FILE = "config.yaml"
ENV_FILE = "env.txt"
ARGS_FILE = "args.json"
# The project's loggers besides detectron2's own ("detectron2"), all to the console of rank 0 and
# OUTPUT_DIR/log.txt. Names only: "transfer" is configured here without importing it.
_LOGGERS = ("fvcore", "pretrain", "transfer")


def dump_run_info(
    output_dir: str,
    cfg: CfgNode | None = None,
    args: argparse.Namespace | Mapping | None = None,
) -> None:
    """Write ``config.yaml`` (``cfg``), ``args.json`` (``args`` and ``sys.argv``) and ``env.txt``
    into ``output_dir``, each atomically. Call it on the main process only."""
    from detectron2.utils.collect_env import collect_env_info

    os.makedirs(output_dir, exist_ok=True)
    if cfg is not None:
        atomic_write_bytes(os.path.join(output_dir, CONFIG_FILE), cfg.dump().encode())
    if args is not None:
        values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
        text = json.dumps({**values, "argv": sys.argv}, indent=2, default=str)
        atomic_write_bytes(os.path.join(output_dir, ARGS_FILE), text.encode())
    atomic_write_bytes(os.path.join(output_dir, ENV_FILE), (collect_env_info() + "\n").encode())


def setup_run(
    cfg: CfgNode, args: argparse.Namespace | None = None, *, dump: bool = True
) -> logging.Logger:
    """Loggers to ``cfg.OUTPUT_DIR/log.txt``, :func:`dump_run_info` (unless not ``dump``),
    per-rank seeds and cudnn's benchmark mode; returns the ``detectron2`` logger. Not
    ``default_setup``: it writes non-atomically and reads keys through OmegaConf, which fails on
    fvcore's ``CfgNode``.
    """
    from detectron2.utils import comm
    from detectron2.utils.env import seed_all_rng
    from detectron2.utils.logger import setup_logger

    output_dir = cfg.OUTPUT_DIR
    rank = comm.get_rank()
    if comm.is_main_process() and output_dir:
        os.makedirs(output_dir, exist_ok=True)
    for name in _LOGGERS:
        setup_logger(output_dir, distributed_rank=rank, name=name)
    logger = setup_logger(output_dir, distributed_rank=rank)
    logger.info(f"Rank of current process: {rank}. World size: {comm.get_world_size()}")
    logger.info("Command line: " + " ".join(sys.argv))
    if args is not None:
        logger.info(f"Command line arguments: {args}")
    if comm.is_main_process() and output_dir and dump:
        dump_run_info(output_dir, cfg)
        logger.info(
            f"Full config and environment saved to {output_dir} ({CONFIG_FILE}, {ENV_FILE})"
        )
    seed = cfg.get("SEED", -1)
    seed_all_rng(None if seed < 0 else seed + rank)
    # as default_setup: cudnn's benchmark costs more than it saves in evaluation-only runs
    eval_only = bool(getattr(args, "eval_only", False))
    torch.backends.cudnn.benchmark = bool(cfg.get("CUDNN_BENCHMARK", False)) and not eval_only
    return logger
