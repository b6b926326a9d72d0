"""A 2-D t-SNE of a pretraining run's kNN features, coloured by class, beside random init.

  python tools/plot_embedding.py output/lorac_in100 --images 500

RUN is a pretraining run directory (config.yaml and its last checkpoint) or a checkpoint file
with config.yaml beside it. The images are the kNN monitor's labelled test images (TEST.KNN_ROOT's
val/, or Fashion-MNIST's test split), evenly spaced; the features its backbone features. Writes
RUN/embedding_tsne.png (or --out). tools/make_report.py draws the same picture for each run. See
docs/analysis.md.
"""

from __future__ import annotations

import argparse

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import exit_on_user_error
from transfer.analysis import AnalysisError
from transfer.analysis.embedding import draw_embedding

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ToolParser(description=__doc__)
    p.add_argument("run", metavar="RUN", help="pretraining run directory or checkpoint")
    p.add_argument("--images", type=int, default=300, help="labelled test images (default 300)")
    p.add_argument("--out", default="", help="PNG path (default RUN/embedding_tsne.png)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    return p.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.images < 4:
        raise AnalysisError(f"--images {args.images}: t-SNE needs at least 4 images")
    pic = draw_embedding(args.run, args.out, args.images, args.device)
    print(f"wrote {pic.path} ({pic.images} images of {pic.classes} classes, t-SNE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
