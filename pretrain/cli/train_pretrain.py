"""Pretrain LORAC / MoCo-M / MoCo-v2 (one process per GPU, or CPU processes with gloo).

  python tools/train_pretrain.py --config-file configs/pretrain/in1k_r50_lorac_200ep.yaml \
      --num-gpus 8 OUTPUT_DIR output/lorac DATASETS.ROOT /data/imagenet/train \
      TEST.KNN_ROOT /data/imagenet

Runs resume automatically from OUTPUT_DIR/last_checkpoint when it exists; with
--resume-with-changes the resume may change SOLVER.BASE_LR, SOLVER.FINAL_LR, SOLVER.MAX_ITER and
SOLVER.EPOCHS (a lower lr after a divergence, a longer schedule, a finished run extended), each
change recorded in OUTPUT_DIR/config_changes.json and metrics.json. Ctrl-C saves a
checkpoint after the current iteration and stops with status 130 (a second Ctrl-C stops at once,
without one); the same command resumes.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

from detectron2.engine import launch

from pretrain.cli.overrides import parse_args_and_overrides
from pretrain.cli.user_errors import exit_on_interrupt, exit_on_user_error
from pretrain.config.resume import RESUME_FLAG, RESUME_FLAG_HELP
from pretrain.engine.launch import argument_parser, check_device, load_args_config, setup
from pretrain.engine.run import run_pretraining
from pretrain.utils.distributed import set_fail_fast_env
from pretrain.utils.output_dir import check_output_dir

__all__ = ["main", "restart_hint", "train"]


@exit_on_user_error
def train(args: argparse.Namespace) -> None:
    """Set up, resume and train in one process (what ``launch`` runs in each worker)."""
    changes = args.resume_with_changes
    run_pretraining(setup(args, changes), stop_on_interrupt=True, resume_with_changes=changes)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__.splitlines()[0])
    parser.add_argument(RESUME_FLAG, action="store_true", help=RESUME_FLAG_HELP)
    args = parse_args_and_overrides(parser, argv)
    # the process-group timeout is launch's to pass; the workers load the config again in setup()
    cfg = load_args_config(args)
    check_output_dir(cfg.OUTPUT_DIR)  # before launch starts --num-gpus workers
    check_device(cfg.MODEL.DEVICE)  # once, before launch starts --num-gpus workers
    set_fail_fast_env()  # inherited by launch's workers, before they create the process group
    # a second Ctrl-C (the first saves and stops at a boundary), or one before training started
    with exit_on_interrupt(lambda: restart_hint(cfg.OUTPUT_DIR)):
        _launch(args, cfg.DIST.TIMEOUT_MINUTES)
    return 0


def restart_hint(output_dir: str) -> str:
    """What the same command does after a pretraining run in ``output_dir`` stopped at once."""
    if os.path.isfile(os.path.join(output_dir, "last_checkpoint")):
        return f"without a checkpoint; the same command resumes from the last one in {output_dir}"
    return f"no checkpoint in {output_dir} yet; the same command starts the run again"


def _launch(args: argparse.Namespace, timeout_minutes: float) -> None:
    launch(
        train,
        args.num_gpus,
        args.num_machines,
        args.machine_rank,
        args.dist_url,
        args=(args,),
        timeout=timedelta(minutes=timeout_minutes),
    )


if __name__ == "__main__":
    raise SystemExit(main())
