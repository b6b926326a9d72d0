"""Linear classification on frozen features (paper Table 1, ImageNet-100 ablations).

  python tools/linear_probe.py --config-file configs/eval/linear_lorac_in1k.yaml \
      --checkpoint lorac_200ep.pth --data-root /data/imagenet --output-dir out/lin_lorac
  python tools/linear_probe.py ... --num-gpus 4            # DDP on the linear layer

See docs/evaluation.md for recipes, layouts and the tables it writes.
"""

from __future__ import annotations

import argparse
import functools

from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.cli.arguments import add_device_arg
from pretrain.cli.launching import launch_parser, launch_tool, parse_launch_args
from pretrain.cli.user_errors import exit_on_user_error, tool_main
from transfer.classification.cli import (
    add_model_args,
    check_table_row,
    key_value,
    start_run,
    write_table_row,
)
from transfer.classification.config import linear_probe_defaults
from transfer.classification.probe import build_classification_sets, run_linear_probe
from transfer.classification.report import LINEAR_COLUMNS, pct
from transfer.cli.common import output_dir_hint
from transfer.tables import data_source

__all__ = ["TABLE", "main", "parse_args", "probe"]

TABLE = "table1_linear.csv"  # in --table-dir, with its Markdown twin


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = launch_parser(__doc__)
    add_model_args(parser)
    parser.add_argument(
        "--data-root",
        required=True,
        help="ImageFolder root (train/, val/) or "
        "the Fashion-MNIST idx directory with DATA.NAME fashion-mnist",
    )
    add_device_arg(parser)
    parser.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        type=key_value,
        help="extra Table 1 columns, e.g. 'train. epoch=200'",
    )
    return parse_launch_args(parser, argv)


def _sources(cfg: CfgNode, args: argparse.Namespace) -> dict[str, str]:
    """The figures of a probe's row and the data they are computed on (they key the row)."""
    source = data_source(cfg.DATA.NAME, args.data_root, cfg.DATA.CLASS_LIST)
    return {"Top-1": source, "Top-5": source}


@exit_on_user_error
def probe(args: argparse.Namespace) -> None:
    """Train and evaluate the probe in one process (what ``launch`` runs in each worker)."""
    start = start_run(
        linear_probe_defaults(),
        args,
        prepare=lambda c: build_classification_sets(c, args.data_root),
        check=lambda s: check_table_row(
            args, s.owner, TABLE, LINEAR_COLUMNS[0], _sources(s.cfg, args)
        ),
    )
    if start.done:
        return
    cfg, backbone = start.cfg, start.backbone
    result = run_linear_probe(
        cfg, backbone, args.data_root, start.device, args.resume, start.data, start.log_to
    )
    if comm.is_main_process():
        start.run_dir.write_results(
            {"top1": result.top1, "top5": result.top5, "max_iter": result.max_iter},
            cfg,
            model=start.owner.name,
            weights_sha256=start.owner.weights,
            checkpoint=args.checkpoint or "",
        )
        epochs = cfg.SOLVER.EPOCHS if not cfg.SOLVER.MAX_ITER else f"{result.max_iter} it"
        row = {
            "arch.": backbone.arch,
            "pars. (M)": f"{backbone.num_params / 1e6:.1f}",
            "batchsize": cfg.SOLVER.BATCH_SIZE,
            "epochs": epochs,
            "Top-1": pct(result.top1),
            "Top-5": pct(result.top5),
            **dict(args.meta),
        }
        title = "Linear classification (paper Table 1)"
        csv_path = write_table_row(
            args, start.owner, TABLE, LINEAR_COLUMNS, row, title, _sources(cfg, args)
        )
        print(f"top-1 {pct(result.top1)}  top-5 {pct(result.top5)}  -> {csv_path}")


main = tool_main(parse_args, functools.partial(launch_tool, probe), output_dir_hint)


if __name__ == "__main__":
    raise SystemExit(main())
