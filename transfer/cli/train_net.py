"""Fine-tune and evaluate detectron2 models (COCO, VOC, LVIS, Cityscapes) from a converted backbone.

detectron2's tools/train_net.py with this project's trainer (transfer/detection/trainer.py):

    python tools/train_net.py --config-file configs/coco_mask_rcnn_lorac.yaml --num-gpus 8 \
        MODEL.WEIGHTS pretrained/lorac_r50.pkl OUTPUT_DIR output/coco/mask_lorac
    python tools/train_net.py --config-file configs/coco_mask_rcnn_lorac.yaml \
        --register-coco fruits data/trainval.json data/images MODEL.DEVICE cpu \
        DATASETS.TRAIN "('fruits',)" DATASETS.TEST "('fruits',)" MODEL.ROI_HEADS.NUM_CLASSES 3

Datasets are read from $DETECTRON2_DATASETS (detectron2's builtin layouts: coco/, VOC2007/,
VOC2012/, lvis/, cityscapes/); the evaluator follows the test set's evaluator_type. Setup problems
(unknown config keys, missing files, weights that do not fit) end with one `error:` line.

One run per OUTPUT_DIR: a directory holding a run is refused unless --resume (same config; a
finished run has nothing left to do) or --overwrite (deletes the old run's files first).
Ctrl-C saves a checkpoint after the current iteration and stops (exit status 130); the same
command with --resume continues from it.
"""

from __future__ import annotations

import argparse

from pretrain.cli.launching import launch_tool, parse_launch_args
from pretrain.cli.user_errors import exit_on_interrupt, exit_on_user_error
from transfer.detection.trainer import (
    build_argument_parser,
    detection_run_dir,
    load_checked_config,
    run,
)

__all__ = ["main", "train"]


@exit_on_user_error
def train(args: argparse.Namespace) -> dict:
    """:func:`transfer.detection.trainer.run` in one process (what ``launch`` runs per worker)."""
    return run(args)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_launch_args(build_argument_parser(), argv, eval_only=True)
    # Fail fast in this process, before spawning workers that would each fail the same way.
    cfg, _ = load_checked_config(args)
    # the first Ctrl-C in training saves and stops at the next iteration (DetectionTrainer)
    with exit_on_interrupt(detection_run_dir(cfg).restart_hint):
        return launch_tool(train, args)


if __name__ == "__main__":
    raise SystemExit(main())
