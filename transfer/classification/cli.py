"""Command-line pieces shared by the classification tools (:mod:`transfer.cli`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.utils.run_setup import setup_run

from .backbone import ARCHS, EvalBackbone, load_eval_backbone
from .config import load_config

__all__ = [
    "add_model_args",
    "key_value",
    "model_from_args",
    "model_name",
    "reject_eval_only",
    "start_run",
    "table_dir",
]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH`` | ``--random-init ARCH``, ``--init-seed``, ``--name``, dirs."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--checkpoint",
        help="pretrained ResNet weights in any layout of docs/checkpoints.md: this project's, "
        "MoCo/LORAC, torchvision, SwAV, DINO, solo-learn, VISSL, converted SimCLR/BYOL, "
        "detectron2 .pkl",
    )
    which.add_argument("--random-init", choices=list(ARCHS), help="random baseline of this arch")
    parser.add_argument("--init-seed", type=int, default=0, help="seed of --random-init")
    parser.add_argument("--name", default="", help="row name in the tables (default: derived)")
    parser.add_argument("--output-dir", required=True, help="run directory (logs, config)")
    parser.add_argument(
        "--table-dir", default="", help="where the Markdown/CSV tables go (default: output dir); "
        "runs of other models with the same table dir add rows",
    )  # fmt: skip


def key_value(text: str) -> tuple[str, str]:
    """argparse type of ``KEY=VALUE`` options."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def model_from_args(args: argparse.Namespace) -> EvalBackbone:
    """The backbone of ``--checkpoint`` / ``--random-init``; prints which layout was read."""
    backbone = load_eval_backbone(args.checkpoint, args.random_init, args.init_seed)
    if comm.is_main_process():
        print(f"backbone: {backbone.description}")
    return backbone


def model_name(args: argparse.Namespace) -> str:
    if args.name:
        return args.name
    if args.random_init:
        return f"random-init {args.random_init}"
    return os.path.splitext(os.path.basename(args.checkpoint))[0]


def table_dir(args: argparse.Namespace) -> str:
    return args.table_dir or args.output_dir


def reject_eval_only(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """detectron2's ``default_argument_parser`` offers ``--eval-only``; these tools have nothing to
    evaluate alone, so it is a usage error."""
    if args.eval_only:
        parser.error("--eval-only is not supported by this tool")


def start_run(
    defaults: CfgNode, args: argparse.Namespace, extra_opts: Sequence[str] = ()
) -> tuple[CfgNode, EvalBackbone]:
    """The start every classification tool shares: the config (``--config-file``, the tool's own
    overrides ``extra_opts``, then ``OUTPUT_DIR`` and ``--device``), the backbone, then the run
    directory. The backbone is read before anything is written, so a bad checkpoint leaves no
    run directory behind."""
    opts = [*args.opts, *extra_opts, "OUTPUT_DIR", args.output_dir]
    if args.device:
        opts += ["DEVICE", args.device]
    cfg = load_config(defaults, args.config_file, opts)
    backbone = model_from_args(args)
    setup_run(cfg)
    return cfg, backbone
