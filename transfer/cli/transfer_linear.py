"""Transfer to 12 classification datasets (paper Table 2) and VOC2007: linear or fine-tuned.

  python tools/transfer_linear.py --config-file configs/eval/transfer_linear.yaml \
      --checkpoint lorac_200ep.pth --name LORAC --data-root /data/transfer \
      --output-dir out/transfer_lorac --table-dir out/tables
  python tools/transfer_linear.py ... --datasets cifar10,dtd        # a subset
  python tools/transfer_linear.py --config-file configs/eval/transfer_linear_augmented.yaml ...
  python tools/transfer_linear.py --config-file configs/eval/transfer_finetune.yaml ...
  python tools/transfer_linear.py ... --datasets voc2007     # VOC2007, the 13th (11-point mAP)

TRANSFER.PROTOCOL: cached_features (default: centre-crop features computed once and cached),
augmented (the paper's random-resized-crop + flip images through the frozen backbone every step)
or finetune (the whole network per dataset, lr and weight decay searched on val). The tool keeps
its name for all three. --resume continues an interrupted run: finished datasets and search
points are read back, an unfinished fine-tuning point continues from its checkpoint.

Each dataset is read from <data-root>/<key> (or TRANSFER.ROOTS.<KEY>) in its published layout.
See docs/evaluation.md for layouts, validation splits, protocols, their costs and budgets.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict

from pretrain.cli.arguments import comma_separated
from pretrain.cli.user_errors import tool_main
from transfer.classification.cli import ROW_CLASH_HINT, start_run, table_dir
from transfer.classification.config import TRANSFER_PROTOCOLS, transfer_defaults
from transfer.classification.transfer import (
    build_transfer_datasets,
    check_tables,
    comparability,
    run_transfer,
    table_sources,
    write_tables,
)
from transfer.classification.transfer_datasets import ALL_DATASET_NAMES
from transfer.cli.common import feature_tool_parser, output_dir_hint, parse_feature_tool_args
from transfer.run_dir import RunAction

__all__ = ["evaluate", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = feature_tool_parser(__doc__)
    parser.add_argument("--data-root", default="", help="directory holding <key>/ per dataset")
    parser.add_argument(
        "--datasets",
        type=comma_separated(ALL_DATASET_NAMES),
        default="",
        help="comma-separated keys (default: the paper's 12; voc2007 on request)",
    )
    kept = "finished datasets and search points are read back, the interrupted one goes on"
    return parse_feature_tool_args(parser, argv, resume_kept=kept)


def evaluate(args: argparse.Namespace) -> int:
    """The transfer of ``args`` (every dataset, results, tables) by ``TRANSFER.PROTOCOL``."""
    opts = []
    if args.data_root:
        opts += ["TRANSFER.DATA_ROOT", args.data_root]
    if args.datasets:
        opts += ["TRANSFER.DATASETS", str([d.strip() for d in args.datasets.split(",")])]
    if args.cache_dir:
        opts += ["FEATURES.CACHE_DIR", args.cache_dir]
    keyed = {"replace": args.replace_row, "hint": ROW_CLASH_HINT}
    start = start_run(
        transfer_defaults(), args, opts, own=(*TRANSFER_PROTOCOLS, "datasets"),
        prepare=build_transfer_datasets,
        check=lambda s: check_tables(
            table_dir(args), s.owner, s.cfg.TRANSFER.PROTOCOL, **keyed, sources=table_sources(s.cfg)
        ),
    )  # fmt: skip
    if start.done:
        return 0
    resume = start.action is RunAction.RESUME
    results = run_transfer(
        start.cfg, start.backbone, start.device, start.data, resume, start.log_to
    )
    start.run_dir.write_results(
        {r.key: asdict(r) for r in results},
        start.cfg,
        model=start.owner.name,
        weights_sha256=start.owner.weights,
        checkpoint=args.checkpoint or "",
    )
    md = write_tables(
        table_dir(args),
        start.owner,
        results,
        **keyed,
        sources=table_sources(start.cfg),
        comparable=comparability(start.cfg, start.backbone.arch),
    )
    with open(md) as f:
        print(f.read())
    finetune = start.cfg.TRANSFER.PROTOCOL == "finetune"
    details = "transfer_finetune_details.csv" if finetune else "transfer_details.csv"
    print(f"tables: {md} (+ .csv, .png); details: {os.path.join(table_dir(args), details)}")
    return 0


main = tool_main(parse_args, evaluate, output_dir_hint)

if __name__ == "__main__":
    raise SystemExit(main())
