"""The tools that run under detectron2's ``launch`` (one process per GPU, or CPU processes):
their parser, its checks, and the launch itself."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta

from detectron2.engine import default_argument_parser, launch
from detectron2.engine.launch import DEFAULT_TIMEOUT

from pretrain.cli.arguments import ToolParser
from pretrain.cli.overrides import parse_args_and_overrides

__all__ = ["launch_parser", "launch_tool", "parse_launch_args"]


def launch_parser(doc: str = "") -> ToolParser:
    """detectron2's ``default_argument_parser`` (``--config-file``, processes, ``--resume``,
    ``--eval-only``, overrides) as a :class:`ToolParser`, ``doc`` its epilog."""
    return ToolParser(epilog=doc, parents=[default_argument_parser()], add_help=False)


def parse_launch_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None, eval_only: bool = False
) -> argparse.Namespace:
    """``parser``'s arguments, its options also after the overrides; ``--num-gpus`` and
    ``--num-machines`` at least 1 (``launch`` silently runs 0 as one process), ``--machine-rank``
    one of the machines, and ``--eval-only`` (offered by detectron2's parser) refused unless
    ``eval_only``."""
    args = parse_args_and_overrides(parser, argv)
    if getattr(args, "eval_only", False) and not eval_only:
        parser.error("--eval-only is not supported by this tool")
    for flag in ("--num-gpus", "--num-machines"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < 1:
            parser.error(f"argument {flag}: must be >= 1, got {value}")
    if not 0 <= args.machine_rank < args.num_machines:
        parser.error(
            f"argument --machine-rank: must be in [0, --num-machines {args.num_machines}), got "
            f"{args.machine_rank}"
        )
    return args


def launch_tool(
    fn: Callable[[argparse.Namespace], object],
    args: argparse.Namespace,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> int:
    """``fn(args)`` in each of the ``--num-gpus`` x ``--num-machines`` processes (``timeout``:
    the process group's); exit status 0."""
    launch(
        fn, args.num_gpus, args.num_machines, args.machine_rank, args.dist_url, args=(args,),
        timeout=timeout,
    )  # fmt: skip
    return 0
