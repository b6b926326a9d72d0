#!/usr/bin/env python
"""Pretrain LORAC / MoCo-M / MoCo-v2 (one process per GPU, or CPU processes with gloo).

  python tools/train_pretrain.py --config-file configs/pretrain/in1k_r50_lorac_200ep.yaml \
      --num-gpus 8 OUTPUT_DIR output/lorac DATASETS.ROOT /data/imagenet/train

Runs resume automatically from OUTPUT_DIR/last_checkpoint when it exists.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectron2.engine import launch  # noqa: E402

from pretrain.config import ConfigError  # noqa: E402
from pretrain.data.datasets import DatasetError  # noqa: E402
from pretrain.engine.launch import argument_parser, setup  # noqa: E402
from pretrain.engine.trainer import PretrainTrainer  # noqa: E402


def main(args) -> None:
    cfg = setup(args)
    trainer = PretrainTrainer(cfg)
    trainer.resume()
    trainer.train()


def cli() -> int:
    args = argument_parser(__doc__.splitlines()[0]).parse_args()
    try:
        launch(
            main, args.num_gpus, args.num_machines, args.machine_rank, args.dist_url, args=(args,)
        )
    except (ConfigError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
