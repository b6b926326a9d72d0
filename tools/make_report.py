#!/usr/bin/env python
"""One HTML + Markdown report of pretraining runs, evaluation tables and nuclear-norm figures.

  python tools/make_report.py output/lorac output/mocom output/mocov2 --out output/report \
      --eval-dir output/tables --detection-dir output/coco --ablation-dir output/in100_tables \
      --nuclear-dir output/nuclear

RUN_DIR is a pretraining OUTPUT_DIR (metrics.json, config.yaml), optionally LABEL=RUN_DIR.
--eval-dir: folders with the CSV tables of tools/linear_probe.py (Table 1), transfer_linear.py
(Table 2), semi_supervised.py (Table 3), knn_eval.py; --detection-dir: tools/train_net.py run
folders (results.json) or collect_detection_results.py CSVs (Table 4); --ablation-dir: linear
probes of the ImageNet-100 prior ablation (Table 5). Writes OUT/report.html (self-contained) and
OUT/report.md with its PNGs in OUT/figures/. See docs/analysis.md.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transfer.analysis import AnalysisError  # noqa: E402
from transfer.analysis.report import build_report  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="*", metavar="[LABEL=]RUN_DIR", help="pretraining run folders")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--eval-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--detection-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--ablation-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--nuclear-dir", default="", metavar="D", help="analyze_nuclear_norm.py --out")
    p.add_argument("--title", default="LORAC experiment report")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (
        args.runs or args.eval_dir or args.detection_dir or args.ablation_dir or args.nuclear_dir
    ):
        print("error: nothing to report: give run folders or result folders", file=sys.stderr)
        return 2
    try:
        report = build_report(
            args.runs,
            args.out,
            eval_dirs=args.eval_dir,
            detection_dirs=args.detection_dir,
            ablation_dirs=args.ablation_dir,
            nuclear_dir=args.nuclear_dir,
            title=args.title,
        )
    except AnalysisError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(
        f"wrote {report.html_path} and {report.markdown_path} "
        f"({len(report.figures)} figures, {len(report.tables)} tables)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
