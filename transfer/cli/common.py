"""What the tools of :mod:`transfer.cli` share beyond the floor every tool stands on
(:mod:`pretrain.cli`): the dataset options, the parser of the tools on cached features, and the
hint after a Ctrl-C from the run directory."""

from __future__ import annotations

import argparse

from pretrain.cli.arguments import ToolParser, add_device_arg
from pretrain.cli.overrides import parse_args_and_overrides
from transfer.classification.cli import add_model_args
from transfer.run_dir import RunDir

__all__ = [
    "add_dataset_args",
    "feature_tool_parser",
    "output_dir_hint",
    "parse_feature_tool_args",
]


def add_dataset_args(parser: argparse.ArgumentParser, root_help: str, class_list_help: str) -> None:
    """``--dataset`` (fashion-mnist or imagefolder), ``--data-root`` and ``--class-list``."""
    parser.add_argument("--dataset", choices=["fashion-mnist", "imagefolder"], required=True)
    parser.add_argument("--data-root", required=True, help=root_help)
    parser.add_argument("--class-list", default="", help=class_list_help)


def output_dir_hint(args: argparse.Namespace) -> str:
    """How a tool that a Ctrl-C stopped at once goes on, from what its ``--output-dir`` holds
    (with ``--resume`` where the tool has it)."""
    return RunDir(args.output_dir, resumable=hasattr(args, "resume")).restart_hint()


def feature_tool_parser(doc: str) -> ToolParser:
    """The parser of a tool on cached features of a model: ``--config-file`` and the model
    arguments; the tool adds its own, then parses with :func:`parse_feature_tool_args`."""
    parser = ToolParser(description=doc)
    parser.add_argument("--config-file", default="", metavar="FILE")
    add_model_args(parser)
    return parser


def parse_feature_tool_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, resume_kept: str = ""
) -> argparse.Namespace:
    """``parser``'s arguments with ``--cache-dir``, ``--resume`` (its help saying what a resume
    keeps: ``resume_kept``), ``--device`` and trailing ``KEY VALUE`` overrides added (its options
    also after the overrides)."""
    resume = "continue the unfinished run in --output-dir"
    parser.add_argument("--cache-dir", default="", help="feature cache (default: <output>/...)")
    parser.add_argument(
        "--resume", action="store_true", help=f"{resume}: {resume_kept}" if resume_kept else resume
    )
    add_device_arg(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides: KEY VALUE ...")
    return parse_args_and_overrides(parser, argv)
