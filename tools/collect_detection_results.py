#!/usr/bin/env python
"""Gather finished detectron2 runs into a Markdown and a CSV table shaped like Table 4.

    python tools/collect_detection_results.py output/coco/* --out output/coco/table4
    python tools/collect_detection_results.py lorac=output/coco/mask_lorac \
        supervised=output/coco/mask_sup --out table

Each RUN_DIR is an OUTPUT_DIR of tools/train_net.py; its row is named after the weights file
(`random` without one) unless given as LABEL=RUN_DIR. Writes PREFIX.md and PREFIX.csv.
"""

from __future__ import annotations

import argparse
import os
import sys

from transfer.detection.results import ResultsError, read_run, write_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    except (ResultsError, OSError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    with open(md) as f:
        print(f.read(), end="")
    print(f"wrote {md} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
