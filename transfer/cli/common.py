"""Argument handling shared by the tools of :mod:`transfer.cli`: their parsers, the options they
share, the options dataclasses filled from the parsed arguments, and ``launch``."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from detectron2.engine import default_argument_parser, launch

from pretrain.cli.arguments import ToolParser, check_launch_args
from pretrain.cli.overrides import parse_args_and_overrides
from pretrain.cli.user_errors import exit_on_interrupt
from transfer.classification.cli import add_model_args, reject_eval_only
from transfer.run_dir import RunDir

__all__ = [
    "DATASET_CHOICES",
    "add_dataset_args",
    "add_device_arg",
    "launch_parser",
    "launch_tool",
    "options_from_args",
    "parse_launch_args",
]

DATASET_CHOICES = ["fashion-mnist", "imagefolder"]

_Options = TypeVar("_Options")


def add_dataset_args(parser: argparse.ArgumentParser, root_help: str, class_list_help: str) -> None:
    """``--dataset`` (fashion-mnist or imagefolder), ``--data-root`` and ``--class-list``."""
    parser.add_argument("--dataset", choices=DATASET_CHOICES, required=True)
    parser.add_argument("--data-root", required=True, help=root_help)
    parser.add_argument("--class-list", default="", help=class_list_help)


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    """``--device``: a torch device name, or empty for the default (this process's GPU if any)."""
    parser.add_argument("--device", default="", help="cpu, cuda, cuda:1 (default: auto)")


def launch_parser(doc: str) -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` (``--config-file``, processes, ``--resume``,
    overrides) with the model arguments, for the tools that run under ``launch``."""
    parser = ToolParser(epilog=doc, parents=[default_argument_parser()], add_help=False)
    add_model_args(parser)
    return parser


def parse_launch_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> argparse.Namespace:
    """``parser``'s arguments, its options also after the overrides; ``--eval-only`` (offered by
    detectron2's parser) is refused, and process counts below 1."""
    args = parse_args_and_overrides(parser, argv)
    reject_eval_only(parser, args)
    check_launch_args(parser, args)
    return args


def launch_tool(fn: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> int:
    """``fn(args)`` in each of the ``--num-gpus`` x ``--num-machines`` processes; exit status 0.
    A Ctrl-C that stops the tool at once (outside its training loop, which saves a checkpoint
    first, or a second one) ends it with one line saying how ``--output-dir`` goes on."""
    run_dir = RunDir(args.output_dir, resumable=hasattr(args, "resume"))
    with exit_on_interrupt(run_dir.restart_hint):
        launch(fn, args.num_gpus, args.num_machines, args.machine_rank, args.dist_url, args=(args,))
    return 0


def options_from_args(
    cls: Callable[..., _Options], args: argparse.Namespace, **overrides: Any
) -> _Options:
    """The options dataclass ``cls`` with every field that ``args`` has an argument of the same
    name for taken from ``args``, then ``overrides``; the other fields keep their defaults."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
    }
    return cls(**{**values, **overrides})
