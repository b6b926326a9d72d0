"""`make demo`: pretrain LORAC on Fashion-MNIST (ResNet-18, CPU, a few minutes), report the kNN
top-1 of the learned features beside raw pixels and a randomly initialised network, and convert
the backbone to detectron2 when its stem allows (see docs/demo.md)."""

from __future__ import annotations

import argparse
import os

from pretrain.cli.arguments import ToolParser
from pretrain.cli.overrides import parse_args_and_overrides
from pretrain.cli.train_pretrain import restart_hint
from pretrain.cli.user_errors import tool_main
from transfer.classification.demo import format_knn_report, format_training_summary, run_demo
from transfer.detection.convert import D2_STEM_UNSUPPORTED, convert_checkpoint

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", default="output/demo")
    ap.add_argument("--knn-train", type=int, default=10000, help="kNN reference images")
    ap.add_argument("--knn-test", type=int, default=10000, help="kNN test images")
    ap.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ...")
    return parse_args_and_overrides(ap, argv)


def _demo(args: argparse.Namespace) -> int:
    res = run_demo(args.output_dir, args.opts, n_train=args.knn_train, n_test=args.knn_test)
    print()
    print(format_training_summary(res))
    print(f"checkpoint        : {res.checkpoint}")
    if res.stem == "imagenet":
        d2 = os.path.join(args.output_dir, "model_final_d2.pkl")
        convert_checkpoint(res.checkpoint, d2)
        print(f"detectron2 weights: {d2}")
    else:
        why = D2_STEM_UNSUPPORTED.format(stem=res.stem)
        print(why[0].upper() + why[1:] + ".")
    print(format_knn_report(res))
    return 0


# Ctrl-C in pretraining saves and stops at the next iteration (run_demo); elsewhere, or a second
# one, stops at once
main = tool_main(parse_args, _demo, lambda args: restart_hint(args.output_dir))


if __name__ == "__main__":
    raise SystemExit(main())
