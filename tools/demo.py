#!/usr/bin/env python
"""`make demo`: pretrain LORAC on Fashion-MNIST (ResNet-18, CPU, a few minutes), report the kNN
top-1 of the learned features beside a randomly initialised network, convert to detectron2."""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.demo import run_demo  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", default="output/demo")
    ap.add_argument("--knn-train", type=int, default=10000, help="kNN reference images")
    ap.add_argument("--knn-test", type=int, default=10000, help="kNN test images")
    ap.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ...")
    args = ap.parse_args()
    res = run_demo(args.output_dir, args.opts, n_train=args.knn_train, n_test=args.knn_test)
    from transfer.detection.convert import convert_checkpoint

    d2 = os.path.join(args.output_dir, "model_final_d2.pkl")
    convert_checkpoint(res.checkpoint, d2)
    print()
    print(f"pretraining took {res.train_seconds / 60:.1f} min")
    print(
        f"kNN top-1 on up to {args.knn_test} held-out images "
        f"(k=200, T=0.07, {args.knn_train} references):"
    )
    print(f"  pretrained, {res.method}: {100 * res.knn_pretrained:.2f}%")
    print(f"  random init: {100 * res.knn_random:.2f}%")
    print(f"checkpoint        : {res.checkpoint}")
    print(f"detectron2 weights: {d2}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
