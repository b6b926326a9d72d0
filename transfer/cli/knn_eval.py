"""Weighted kNN classification of frozen features (k and T: --k, --temperature).

  python tools/knn_eval.py --random-init resnet18 --dataset fashion-mnist \
      --data-root /usr/share/datasets/fashion-mnist --image-size 32 --output-dir out/knn
  python tools/knn_eval.py --checkpoint model.pth --dataset imagefolder \
      --data-root /data/imagenet100 --output-dir out/knn_in100

See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from pretrain.cli.arguments import ToolParser, add_device_arg, int_at_least, positive_float
from pretrain.cli.user_errors import tool_main
from pretrain.data.datasets import dataset_type
from pretrain.data.loader import AUTO_WORKERS, resolve_num_workers
from pretrain.engine.writers import log_to_names, write_scalars
from pretrain.evaluation.knn import KNN_K, KNN_T
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_setup import dump_run_info
from transfer.classification.cli import (
    add_model_args,
    check_table_row,
    model_from_args,
    row_owner,
    write_table_row,
)
from transfer.classification.datasets import labelled_sets
from transfer.classification.engine import resolve_device
from transfer.classification.features import FeatureCache
from transfer.classification.knn_eval import run_knn
from transfer.classification.report import pct
from transfer.cli.common import add_dataset_args, output_dir_hint
from transfer.run_dir import RunDir, RunDirError
from transfer.tables import data_source

__all__ = ["TABLE", "evaluate", "main", "parse_args"]

TABLE = "knn.csv"  # in --table-dir, with its Markdown twin


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolParser(description=__doc__)
    add_model_args(parser)
    add_dataset_args(
        parser, "idx directory or <root>/{train,val}", "imagefolder: restrict to these classes"
    )
    parser.add_argument(
        "--image-size", type=int_at_least(1), default=32, help="Fashion-MNIST upsampling"
    )
    parser.add_argument(
        "--resize",
        type=int_at_least(0),
        default=0,
        help="default: 256 (imagefolder) or --image-size (fashion-mnist)",
    )
    parser.add_argument(
        "--crop", type=int_at_least(0), default=0, help="default: 224 or --image-size"
    )
    parser.add_argument(
        "--limit", type=int_at_least(0), default=None, help="fashion-mnist: first N per split"
    )
    parser.add_argument(
        "--k", type=int_at_least(1), default=KNN_K, help="neighbours (default: %(default)s)"
    )
    parser.add_argument(
        "--temperature",
        type=positive_float,
        default=KNN_T,
        help="vote temperature (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int_at_least(1), default=256)
    parser.add_argument(
        "--num-workers",
        type=int_at_least(AUTO_WORKERS),
        default=AUTO_WORKERS,
        help="data workers (default: -1, one per core of this process less one)",
    )
    parser.add_argument("--cache-dir", default="", help="feature cache (default: none)")
    add_device_arg(parser)
    return parser.parse_args(argv)


def evaluate(args: argparse.Namespace) -> int:
    """The kNN evaluation of ``args`` (checks, features, results, table row)."""
    device = resolve_device(args.device)
    log_to = log_to_names(args.log_to)
    workers = resolve_num_workers(args.num_workers, name="--num-workers")
    # everything a mistake can be found in is read before anything is written
    run_dir = RunDir(args.output_dir, "--output-dir", tool="knn_eval")
    action = run_dir.check(overwrite=args.overwrite)
    check_output_dir(args.table_dir, "--table-dir", RunDirError, optional=True)  # "": output dir
    fm = args.dataset == "fashion-mnist"
    resize = args.resize or (args.image_size if fm else 256)
    crop = args.crop or (args.image_size if fm else 224)
    train, test, num_classes = labelled_sets(
        dataset_type(args.dataset),
        args.data_root,
        args.class_list,
        limit=args.limit or 0,
        image_size=args.image_size,
    )
    model = model_from_args(args)
    owner = row_owner(args, model)
    column = f"{args.dataset} kNN top-1"
    limit = f"first {args.limit} per split" if args.limit else ""
    protocol = f"resize {resize} crop {crop} k={args.k} T={args.temperature:g}"
    source = data_source(args.dataset, args.data_root, args.class_list, limit, protocol)
    check_table_row(args, owner, TABLE, "Model", {column: source})
    run_dir.start(action)
    dump_run_info(args.output_dir, args=args)
    res = run_knn(
        model,
        train,
        test,
        num_classes,
        name=args.dataset,
        resize=resize,
        crop=crop,
        k=args.k,
        temperature=args.temperature,
        cache=FeatureCache(args.cache_dir),
        device=device,
        batch_size=args.batch_size,
        num_workers=workers,
    )
    # the name the pretraining kNN monitor logs its accuracy under
    write_scalars(args.output_dir, {"knn/top1": res.top1}, log_to=log_to, config=vars(args))
    run_dir.write_results(
        asdict(res), None, model=owner.name, weights_sha256=owner.weights, args=vars(args)
    )
    row = {
        column: pct(res.top1),
        "k": res.k,
        "T": res.temperature,
        "train/test": f"{res.num_train}/{res.num_test}",
        "input": f"{crop}px",
    }
    title = "Weighted kNN classification"
    columns = ["Model", column, "k", "T"]
    csv_path = write_table_row(args, owner, TABLE, columns, row, title, {column: source})
    print(f"kNN (k={res.k}, T={res.temperature}) top-1 {pct(res.top1)} -> {csv_path}")
    return 0


main = tool_main(parse_args, evaluate, output_dir_hint)

if __name__ == "__main__":
    raise SystemExit(main())
