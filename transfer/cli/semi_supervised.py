"""Semi-supervised fine-tuning on 1% / 10% of ImageNet labels (paper Table 3).

  python tools/semi_supervised.py --config-file configs/eval/semi_1pct.yaml \
      --checkpoint lorac_200ep.pth --name LORAC --data-root /data/imagenet \
      --split-file 1percent.txt --output-dir out/semi1_lorac --table-dir out/tables --num-gpus 4

Runs the whole learning-rate sweep (one fine-tuning per lr, each in <output>/lr_<lr>/), picks the
lr on held-out unlabelled training images and reports ImageNet val top-1/top-5 of that run.
See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import asdict

from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.cli.arguments import add_device_arg
from pretrain.cli.launching import launch_parser, launch_tool, parse_launch_args
from pretrain.cli.user_errors import exit_on_user_error, tool_main
from pretrain.utils.errors import DatasetError
from transfer.classification.cli import add_model_args, check_table_row, start_run, write_table_row
from transfer.classification.config import semi_supervised_defaults
from transfer.classification.report import SEMI_COLUMNS, pct
from transfer.classification.semi import SemiData, run_semi_supervised, semi_data
from transfer.cli.common import output_dir_hint
from transfer.tables import data_source

__all__ = ["RESULTS", "TABLE", "fine_tune", "main", "parse_args"]

RESULTS = "semi_results.json"  # every lr's held-out and val scores, with the config
TABLE = "table3_semi.csv"  # in --table-dir, with its Markdown twin


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = launch_parser(__doc__)
    add_model_args(parser)
    parser.add_argument("--data-root", required=True, help="ImageNet root with train/ and val/")
    parser.add_argument("--split-file", default="", help="SimCLR 1percent.txt / 10percent.txt")
    add_device_arg(parser)
    return parse_launch_args(parser, argv)


def _sources(cfg: CfgNode, args: argparse.Namespace) -> dict[str, str]:
    """The figures of a run's Table 3 cells and the data they are computed on (the label split
    included: another 1% split is another figure)."""
    split = f"split {os.path.abspath(cfg.DATA.SPLIT_FILE)}" if cfg.DATA.SPLIT_FILE else ""
    source = data_source(cfg.DATA.NAME, args.data_root, cfg.DATA.CLASS_LIST, split)
    p = cfg.DATA.LABEL_PERCENT
    return {f"{p}% Top-1": source, f"{p}% Top-5": source}


def _semi_data(cfg: CfgNode, data_root: str) -> SemiData:
    """The run's data; a missing split is named by the flag that gives it."""
    if not cfg.DATA.SPLIT_FILE:
        raise DatasetError(
            "--split-file is missing: give the 1% or 10% label split to fine-tune on (SimCLR's "
            "1percent.txt or 10percent.txt)"
        )
    return semi_data(cfg, data_root)


@exit_on_user_error
def fine_tune(args: argparse.Namespace) -> None:
    """The lr sweep and its report in one process (what ``launch`` runs in each worker)."""
    split = ["DATA.SPLIT_FILE", args.split_file] if args.split_file else []
    start = start_run(
        semi_supervised_defaults(), args, split, own=("lr_*",), results=RESULTS,
        prepare=lambda c: _semi_data(c, args.data_root),
        check=lambda s: check_table_row(
            args, s.owner, TABLE, SEMI_COLUMNS[0], _sources(s.cfg, args)
        ),
    )  # fmt: skip
    if start.done:
        return
    cfg = start.cfg
    res = run_semi_supervised(
        cfg, start.backbone, args.data_root, start.device, start.data, args.resume, start.log_to
    )
    if comm.is_main_process():
        owner = start.owner
        start.run_dir.write_results(
            asdict(res),
            cfg,
            model=owner.name,
            weights_sha256=owner.weights,
            checkpoint=args.checkpoint or "",
        )
        p = f"{res.percent}%"
        row = {f"{p} Top-1": pct(res.top1), f"{p} Top-5": pct(res.top5)}
        title = "Semi-supervised learning (paper Table 3)"
        csv_path = write_table_row(
            args, owner, TABLE, SEMI_COLUMNS, row, title, _sources(cfg, args)
        )
        print(
            f"{p} labels: best lr {res.best_lr:.4g}: top-1 {pct(res.top1)} top-5 "
            f"{pct(res.top5)} -> {csv_path}"
        )


main = tool_main(parse_args, functools.partial(launch_tool, fine_tune), output_dir_hint)


if __name__ == "__main__":
    raise SystemExit(main())
