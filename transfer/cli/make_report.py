"""One HTML + Markdown report of pretraining runs, evaluation tables and nuclear-norm figures.

  python tools/make_report.py output/lorac output/mocom output/mocov2 --out output/report \
      --eval-dir output/tables --detection-dir output/coco --ablation-dir output/in100_tables \
      --nuclear-dir output/nuclear
  python tools/make_report.py --study-records docs/results_runs/study docs/results_runs/beta \
      docs/results_runs/views --out output/study_report

RUN_DIR is a pretraining OUTPUT_DIR (metrics.json, config.yaml), optionally LABEL=RUN_DIR.
--eval-dir: folders with the CSV tables of tools/linear_probe.py (Table 1), transfer_linear.py
(Table 2), semi_supervised.py (Table 3), knn_eval.py; --detection-dir: tools/train_net.py run
folders (results.json) or collect_detection_results.py CSVs (Table 4); --ablation-dir: linear
probes of the ImageNet-100 prior ablation (Table 5); --study-records: folders of study run
records (tools/study.py --records: make study, study-beta, study-views), each shown as on its
docs/results*.md page (LORAC vs MoCo-M paired by seed, the sweep against the paper). Each run
with a checkpoint also gets a t-SNE picture of its kNN features beside random init
(RUN_DIR/embedding_tsne.png; --embedding-images, 0 for none). Writes
OUT/report.html (self-contained) and OUT/report.md with its PNGs in OUT/figures/. See
docs/analysis.md.
"""

from __future__ import annotations

import argparse

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import exit_on_user_error
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_owner import record_owner
from transfer.analysis import AnalysisError
from transfer.analysis.report import build_report
from transfer.study.page import report_sections
from transfer.study.records import load_records

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ToolParser(description=__doc__)
    p.add_argument("runs", nargs="*", metavar="[LABEL=]RUN_DIR", help="pretraining run folders")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--eval-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--detection-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--ablation-dir", nargs="+", action="extend", default=[], metavar="D")
    p.add_argument("--nuclear-dir", default="", metavar="D", help="analyze_nuclear_norm.py --out")
    p.add_argument(
        "--study-records",
        nargs="+",
        action="extend",
        default=[],
        metavar="D",
        help="tools/study.py --records folders, e.g. docs/results_runs/beta",
    )
    p.add_argument("--title", default="LORAC experiment report")
    p.add_argument(
        "--embedding-images",
        type=int,
        default=300,
        metavar="N",
        help="labelled test images in each run's t-SNE picture (0: none; default 300)",
    )
    return p.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (
        args.runs
        or args.eval_dir
        or args.detection_dir
        or args.ablation_dir
        or args.nuclear_dir
        or args.study_records
    ):
        raise AnalysisError("nothing to report: give run folders or result folders")
    if args.embedding_images < 0 or 0 < args.embedding_images < 4:
        raise AnalysisError(
            f"--embedding-images {args.embedding_images}: 0 (no picture) or at least 4 (t-SNE)"
        )
    check_output_dir(args.out, "--out", AnalysisError, owner="make_report")
    # read before anything is written: a bad record stops the report naming its file
    studies = [(d, *load_records(d)) for d in args.study_records]
    report = build_report(
        args.runs,
        args.out,
        eval_dirs=args.eval_dir,
        detection_dirs=args.detection_dir,
        ablation_dirs=args.ablation_dir,
        nuclear_dir=args.nuclear_dir,
        study_records=args.study_records,
        study_sections=lambda fig_dir: report_sections(studies, fig_dir),
        title=args.title,
        embedding_images=args.embedding_images,
    )
    record_owner(args.out, "make_report")
    print(
        f"wrote {report.html_path} and {report.markdown_path} "
        f"({len(report.figures)} figures, {len(report.tables)} tables)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
