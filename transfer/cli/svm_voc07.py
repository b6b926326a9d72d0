"""VOC07 linear SVMs on frozen res5 features (Goyal et al. 2019), optionally low-shot.

  python tools/svm_voc07.py --checkpoint lorac_200ep.pth --name LORAC \
      --data-root /data/VOCdevkit/VOC2007 --output-dir out/svm_voc07/lorac --table-dir out/tables
  python tools/svm_voc07.py ... --low-shot        # + k = 1..96 positives per class, 5 draws
  python tools/svm_voc07.py ... SVM.POOL avgpool6 # OpenSelfSup's 8192-d res5 pooling

--data-root is the VOC2007 folder (Annotations/, ImageSets/Main/, JPEGImages/). Features are
cached; --resume continues an interrupted run (finished draws are kept). See docs/evaluation.md.
"""

from __future__ import annotations

import argparse

from fvcore.common.config import CfgNode

from pretrain.cli.user_errors import tool_main
from transfer.classification.cli import (
    ROW_CLASH_HINT,
    check_table_row,
    start_run,
    table_dir,
)
from transfer.classification.config import svm_defaults
from transfer.classification.svm_benchmark import (
    FULL_FILE,
    LOW_SHOT_DIR,
    TABLE,
    read_voc07,
    run_svm_benchmark,
    write_svm_tables,
)
from transfer.cli.common import feature_tool_parser, output_dir_hint, parse_feature_tool_args
from transfer.run_dir import RunAction
from transfer.tables import data_source

__all__ = ["evaluate", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = feature_tool_parser(__doc__)
    parser.add_argument("--data-root", required=True, help="the VOC2007 folder")
    parser.add_argument(
        "--low-shot", action="store_true", help="also the low-shot SVMs (SVM.LOW_SHOT_K, draws)"
    )
    return parse_feature_tool_args(parser, argv)


def _sources(cfg: CfgNode, args: argparse.Namespace) -> dict[str, str]:
    """What this run's figures are computed on (they key its cells in the table)."""
    how = f"res5 {cfg.SVM.POOL} {cfg.SVM.IMAGE_SIZE}px"
    source = data_source("voc2007", args.data_root, "", how)
    ks = [f"k={k}" for k in cfg.SVM.LOW_SHOT_K] if args.low_shot else []
    return {c: source for c in ["VOC07 SVM", *ks]}


def evaluate(args: argparse.Namespace) -> int:
    """The SVM benchmark of ``args`` (features, SVMs, tables)."""
    opts = ["FEATURES.CACHE_DIR", args.cache_dir] if args.cache_dir else []
    start = start_run(
        svm_defaults(), args, opts, own=(LOW_SHOT_DIR, FULL_FILE),
        prepare=lambda cfg: read_voc07(args.data_root, cfg, args.low_shot),
        check=lambda s: check_table_row(args, s.owner, TABLE, "Model", _sources(s.cfg, args)),
    )  # fmt: skip
    if start.done:
        return 0
    resume = start.action is RunAction.RESUME
    cfg = start.cfg
    result = run_svm_benchmark(cfg, start.backbone, start.data, start.device, args.low_shot, resume)
    start.run_dir.write_results(
        result,
        start.cfg,
        model=start.owner.name,
        weights_sha256=start.owner.weights,
        checkpoint=args.checkpoint or "",
    )
    md = write_svm_tables(
        table_dir(args),
        start.owner,
        result,
        start.cfg,
        start.backbone.arch,
        replace=args.replace_row,
        hint=ROW_CLASH_HINT,
        sources=_sources(start.cfg, args),
    )
    with open(md) as f:
        print(f.read())
    print(f"tables: {md} (+ .csv; low-shot: voc07_svm_low_shot.{{csv,md,png}})")
    return 0


main = tool_main(parse_args, evaluate, output_dir_hint)

if __name__ == "__main__":
    raise SystemExit(main())
