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
import sys
from datetime import timedelta

from fvcore.common.config import CfgNode

from pretrain.cli.arguments import ToolParser
from pretrain.cli.launching import launch_tool, parse_launch_args
from pretrain.cli.user_errors import exit_on_interrupt, exit_on_user_error
from pretrain.config.defaults import check_world_size
from pretrain.config.resume import RESUME_FLAG, RESUME_FLAG_HELP
from pretrain.engine.launch import argument_parser, begin_run, checked_config
from pretrain.engine.run import run_pretraining, train_source
from pretrain.engine.writers import add_log_to_arg, log_to_names
from pretrain.utils.distributed import set_fail_fast_env

__all__ = ["main", "restart_hint", "train"]


@exit_on_user_error
def train(args: argparse.Namespace) -> None:
    """Check, set up, resume and train in one process (what ``launch`` runs in each worker);
    the data is scanned and checked before the run's first write (its lock and log)."""
    changes = args.resume_with_changes
    cfg = checked_config(args, changes)
    source = train_source(cfg)
    begin_run(cfg, args)
    log_to = log_to_names(args.log_to)
    run_pretraining(cfg, stop_on_interrupt=True, resume_with_changes=changes, source=source,
                    log_to=log_to)  # fmt: skip


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__.splitlines()[0], ToolParser)
    parser.add_argument(RESUME_FLAG, action="store_true", help=RESUME_FLAG_HELP)
    add_log_to_arg(parser)
    args = parse_launch_args(parser, argv)
    log_to_names(args.log_to)  # a writer whose package is missing: before anything is written
    # Every check that reads only, once, before launch starts --num-gpus workers (which would
    # each fail alike, after their first writes); the workers check again in train(). The
    # process-group timeout is launch's to pass.
    cfg = checked_config(args, args.resume_with_changes)
    check_world_size(cfg, args.num_gpus * args.num_machines)
    _warn_cpu_processes(cfg, args.num_gpus)
    set_fail_fast_env()  # inherited by launch's workers, before they create the process group
    # a second Ctrl-C (the first saves and stops at a boundary), or one before training started
    with exit_on_interrupt(lambda: restart_hint(cfg.OUTPUT_DIR)):
        return launch_tool(train, args, timedelta(minutes=cfg.DIST.TIMEOUT_MINUTES))


def _warn_cpu_processes(cfg: CfgNode, processes: int) -> None:
    """One line when a CPU run starts more processes on this machine than it has cores: it
    runs, each process slower (they share the cores), and is no error."""
    cores = len(os.sched_getaffinity(0))
    if cfg.MODEL.DEVICE == "cpu" and processes > cores:
        print(
            f"warning: --num-gpus {processes} starts {processes} CPU processes on {cores} "
            "cores: they share them, each slower",
            file=sys.stderr,
            flush=True,
        )


def restart_hint(output_dir: str) -> str:
    """What the same command does after a pretraining run in ``output_dir`` stopped at once."""
    if os.path.isfile(os.path.join(output_dir, "last_checkpoint")):
        return f"without a checkpoint; the same command resumes from the last one in {output_dir}"
    return f"no checkpoint in {output_dir} yet; the same command starts the run again"


if __name__ == "__main__":
    raise SystemExit(main())
