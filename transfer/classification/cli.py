"""Command-line pieces shared by the classification tools (:mod:`transfer.cli`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.utils.run_setup import setup_run
from transfer.run_dir import RESULTS_FILE, RunAction, RunDir, add_run_dir_args

from .backbone import ARCHS, EvalBackbone, load_eval_backbone
from .config import load_config
from .engine import resolve_device

__all__ = [
    "add_model_args",
    "key_value",
    "model_from_args",
    "model_name",
    "reject_eval_only",
    "RESUME_MAY_CHANGE",
    "RunStart",
    "start_run",
    "table_dir",
]

# What a resumed classification run may change besides pretraining's list: how it is run and
# watched (device, loader workers, logging and evaluation periods), not what it computes.
RESUME_MAY_CHANGE = ("DEVICE", "DATA.NUM_WORKERS", "LOG_PERIOD", "TEST.EVAL_PERIOD")


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
    parser.add_argument(
        "--output-dir", required=True, help="run directory (logs, config, results.json); one "
        "run each: a directory holding a run is refused (see --overwrite)",
    )  # fmt: skip
    add_run_dir_args(parser)
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


@dataclass
class RunStart:
    """What :func:`start_run` set up: the config, the device, the run directory and what the run
    does with it (``action`` :attr:`RunAction.DONE`: nothing left to do, and then neither
    ``backbone`` nor ``data`` is read), the backbone and the tool's data."""

    cfg: CfgNode
    device: torch.device
    run_dir: RunDir
    action: RunAction
    backbone: EvalBackbone | None = None
    data: Any = None

    @property
    def done(self) -> bool:
        return self.action is RunAction.DONE


def _done(start: RunStart) -> RunStart:
    if comm.is_main_process():
        run_dir = start.run_dir
        print(f"{run_dir.path} holds a finished run ({run_dir.results}): nothing left to do")
    return start


def start_run(
    defaults: CfgNode,
    args: argparse.Namespace,
    extra_opts: Sequence[str] = (),
    own: Sequence[str] = (),
    results: str = RESULTS_FILE,
    prepare: Callable[[CfgNode], Any] | None = None,
) -> RunStart:
    """The start every classification tool shares: the config (``--config-file``, the tool's own
    overrides ``extra_opts``, then ``OUTPUT_DIR`` and ``--device``), the device, the run
    directory (:mod:`transfer.run_dir`; ``own``: the tool's files ``--overwrite`` deletes,
    ``results``: its results file), the data (``prepare(cfg)``, kept as :attr:`RunStart.data`)
    and the backbone are all read before anything is written, so a mistake leaves no run
    directory behind and a directory holding a run as it was. Then
    the directory's lock and the run setup (logs, config.yaml, env.txt); nothing of it when a
    finished run is resumed (:attr:`RunStart.done`)."""
    opts = [*args.opts, *extra_opts, "OUTPUT_DIR", args.output_dir]
    if args.device:
        opts += ["DEVICE", args.device]
    cfg = load_config(defaults, args.config_file, opts)
    device = resolve_device(cfg.DEVICE)
    resume = bool(getattr(args, "resume", False))
    run_dir = RunDir(
        cfg.OUTPUT_DIR, "--output-dir", results, tuple(own), RESUME_MAY_CHANGE,
        resumable=hasattr(args, "resume"),
    )  # fmt: skip
    action = run_dir.check(resume, args.overwrite, cfg)
    start = RunStart(cfg, device, run_dir, action)
    if start.done:
        return _done(start)
    start.data = prepare(cfg) if prepare else None
    start.backbone = model_from_args(args)
    if comm.is_main_process():
        run_dir.start(action)
    comm.synchronize()
    setup_run(cfg)
    return start
