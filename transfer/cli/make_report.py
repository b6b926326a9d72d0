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

from __future__ import annotations

import argparse

from pretrain.cli.user_errors import exit_on_user_error
from transfer.analysis import AnalysisError
from transfer.analysis.report import build_report
from transfer.cli.common import tool_parser

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = tool_parser(__doc__)
    p.add_argument("runs", nargs="*", metavar="[LABEL=]RUN_DIR", help="pretraining run folders")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--eval-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--detection-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--ablation-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--nuclear-dir", default="", metavar="D", help="analyze_nuclear_norm.py --out")
    p.add_argument("--title", default="LORAC experiment report")
    return p.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (
        args.runs or args.eval_dir or args.detection_dir or args.ablation_dir or args.nuclear_dir
    ):
        raise AnalysisError("nothing to report: give run folders or result folders")
    report = build_report(
        args.runs,
        args.out,
        eval_dirs=args.eval_dir,
        detection_dirs=args.detection_dir,
        ablation_dirs=args.ablation_dir,
        nuclear_dir=args.nuclear_dir,
        title=args.title,
    )
    print(
        f"wrote {report.html_path} and {report.markdown_path} "
        f"({len(report.figures)} figures, {len(report.tables)} tables)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
