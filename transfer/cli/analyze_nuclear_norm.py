"""Nuclear norm of 32 augmented views per test image, per pretrained model (paper Fig. 3b-c, 4c).

  python tools/analyze_nuclear_norm.py output/lorac_b2 output/lorac_b4 output/mocom \
      --dataset imagefolder --data-root /data/imagenet100 --out output/nuclear
  python tools/analyze_nuclear_norm.py output/demo --dataset fashion-mnist \
      --data-root /usr/share/datasets/fashion-mnist --max-images 500 --knn-train 5000 --out out/nn

Each positional argument is a run directory (its config.yaml and last checkpoint) or a
checkpoint file with config.yaml beside it; beta comes from the run's LOSS.BETA (prior "none":
beta = inf). Writes PNG + CSV pairs and results.json into --out (a folder holding an analysis
is refused unless --overwrite); see docs/analysis.md.
"""

from __future__ import annotations

import argparse

import torch

from pretrain.cli.arguments import ToolParser, int_at_least, options_from_args
from pretrain.cli.user_errors import tool_main
from pretrain.data.loader import AUTO_WORKERS
from pretrain.evaluation.knn import KNN_K
from transfer.analysis import AnalysisError
from transfer.analysis.nuclear_norm_outputs import AnalysisOptions, analyze, write_outputs
from transfer.cli.common import add_dataset_args
from transfer.run_dir import RunDir, add_run_dir_args

__all__ = ["analyse", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ToolParser(description=__doc__)
    p.add_argument("models", nargs="+", metavar="CKPT_OR_RUN_DIR")
    add_dataset_args(
        p,
        "idx folder, or <root>/<class>/<img> (<root>/val and <root>/train when both exist)",
        "imagefolder: e.g. imagenet100",
    )
    p.add_argument("--out", required=True, help="output folder for the PNG + CSV pairs")
    p.add_argument(
        "--views", type=int_at_least(2), default=32, help="augmentations per image (paper: 32)"
    )
    p.add_argument(
        "--max-images",
        type=int_at_least(0),
        default=0,
        help="N test images spread over the split (default: all)",
    )
    p.add_argument("--labels", nargs="+", default=[], metavar="NAME", help="one per model")
    p.add_argument("--accuracy-csv", default="", help="CSV: label/run/Method/Model + top-1 (%%)")
    p.add_argument(
        "--knn-train",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="compute accuracy with weighted kNN on N train images instead",
    )
    p.add_argument(
        "--knn-k", type=int_at_least(1), default=KNN_K, help="neighbours (default: %(default)s)"
    )
    p.add_argument(
        "--batch-images", type=int_at_least(1), default=8, help="images per forward (x views)"
    )
    p.add_argument(
        "--num-workers",
        type=int_at_least(AUTO_WORKERS),
        default=AUTO_WORKERS,
        help="data workers (default: -1, one per core of this process less one)",
    )
    p.add_argument("--seed", type=int, default=0, help="augmentation seed")
    p.add_argument("--device", choices=["", "cpu", "cuda"], default="", help="default: auto")
    add_run_dir_args(p)
    return p.parse_args(argv)


def analyse(args: argparse.Namespace) -> int:
    """The analysis of ``args`` (checks, nuclear norms, figures, results.json)."""
    if args.accuracy_csv and args.knn_train:
        raise AnalysisError("give --accuracy-csv or --knn-train, not both")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise AnalysisError("--device cuda but no CUDA device is available")
    opt = options_from_args(AnalysisOptions, args, device=device)
    run_dir = RunDir(args.out, "--out", tool="analyze_nuclear_norm")
    action = run_dir.check(overwrite=args.overwrite)  # before the models are read and analysed
    results = analyze(args.models, opt)
    run_dir.start(action)
    figures = write_outputs(results, args.out, args.views)
    summary = {
        r.label: {"beta": r.beta, "mean_nuclear_norm": float(r.values.mean()), "top1": r.top1}
        for r in results
    }
    run_dir.write_results(summary, None, args=vars(args))
    for r in results:
        acc = f", top-1 {r.top1:.2f}% ({r.top1_source})" if r.top1 is not None else ""
        print(
            f"{r.label}: beta {r.beta:g}, mean ||Q_hat||_* {r.values.mean():.3f} "
            f"over {len(r.values)} images{acc}"
        )
    if "accuracy" not in figures:
        print("no accuracy given (--accuracy-csv / --knn-train): accuracy figure skipped")
    for w in figures.values():
        print(f"wrote {w.png} and {w.csv}")
    return 0


main = tool_main(parse_args, analyse, lambda args: RunDir(args.out, "--out").restart_hint())

if __name__ == "__main__":
    raise SystemExit(main())
