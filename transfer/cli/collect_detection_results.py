"""Gather finished detectron2 runs into Markdown and CSV tables, one per protocol.

COCO R50-FPN 1x is shaped like Table 4; each table ends with its published reference rows.

    python tools/collect_detection_results.py output/coco/* --out output/coco/table4
    python tools/collect_detection_results.py lorac=output/coco/mask_lorac \
        supervised=output/coco/mask_sup --out table

Each RUN_DIR is an OUTPUT_DIR of tools/train_net.py; its row is named after the weights (their
run directory for a run's model_final.*, else the file's name; `random` without weights) unless
given as LABEL=RUN_DIR. Runs from different weights under one name are refused: label them apart.
Writes PREFIX.md (every table) and PREFIX.csv (one protocol) or PREFIX_<protocol>.csv (each).
"""

from __future__ import annotations

import os

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import exit_on_user_error
from pretrain.utils.errors import LoracError
from transfer.detection.results import ResultsError, read_run, write_table

__all__ = ["main"]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="[LABEL=]RUN_DIR", help="finished run dirs")
    parser.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.md/.csv")
    parser.add_argument("--dataset", default=None, help="test dataset, if runs evaluated several")
    args = parser.parse_args(argv)
    try:
        results = []
        for item in args.runs:
            label, sep, run_dir = item.partition("=")
            if not sep or os.path.isdir(item):
                label, run_dir = None, item
            results.append(read_run(run_dir, label=label, dataset=args.dataset))
        md, csv_path = write_table(results, args.out)
    except LoracError:
        raise
    except (OSError, ValueError) as e:  # an unreadable results.json or an unwritable --out
        raise ResultsError(str(e)) from e
    with open(md) as f:
        print(f.read(), end="")
    print(f"wrote {md} and {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
