"""Submit LORAC pretraining (or an evaluation tool) to SLURM through submitit.

  python tools/submit_pretrain.py --config-file configs/pretrain/in1k_r50_lorac_200ep.yaml \
      --nodes 4 --gpus-per-node 8 --partition gpu --timeout 4320 \
      OUTPUT_DIR /checkpoints/lorac DATASETS.ROOT /data/imagenet/train \
      TEST.KNN_ROOT /data/imagenet
  python tools/submit_pretrain.py ... --dry-run        # print the sbatch script and config
  python tools/submit_pretrain.py ... --local --gpus-per-node 0 --tasks-per-node 2   # here
  python tools/submit_pretrain.py --entry linear_probe --nodes 1 --gpus-per-node 8 \
      --config-file configs/eval/linear_lorac_in1k.yaml --checkpoint ... --data-root ...

Preempted or timed-out jobs save a checkpoint at the end of the current iteration, requeue and
resume from it. See docs/cluster.md.
"""

from __future__ import annotations

import argparse

from pretrain.cli.arguments import ToolParser, unknown_option, unknown_option_message
from pretrain.cli.user_errors import exit_on_user_error
from pretrain.cluster.submit import ENTRIES, JobRequest, dry_run_text, submit

__all__ = ["add_resource_arguments", "main", "parse_args", "resource_request"]


def add_resource_arguments(p: argparse.ArgumentParser, nodes: int | None = 1,
                           gpus_per_node: int | None = 1) -> None:  # fmt: skip
    """A job's resource flags (:class:`JobRequest`'s fields) on ``p`` or one of its groups, for
    this tool and ``tools/study.py --executor slurm`` (whose defaults, None, are the
    experiment's)."""
    p.add_argument("--nodes", type=int, default=nodes, help="nodes per (pretraining) job")
    p.add_argument("--gpus-per-node", type=int, default=gpus_per_node,
                   help="one process per GPU; 0: CPU processes")  # fmt: skip
    p.add_argument("--tasks-per-node", type=int, default=None,
                   help="CPU processes per node, with --gpus-per-node 0")  # fmt: skip
    p.add_argument("--partition", default=None)
    p.add_argument("--timeout", type=int, default=72 * 60, help="time limit in minutes")
    p.add_argument("--cpus-per-task", type=int, default=None,
                   help="default: with DATALOADER.NUM_WORKERS -1 the node's cores per GPU (sinfo; "
                        "16 if unknown), else NUM_WORKERS + 1")  # fmt: skip
    p.add_argument("--mem", type=float, default=None, help="memory per node in GB")
    p.add_argument("--account", default=None)
    p.add_argument("--qos", default=None)
    p.add_argument("--constraint", default=None)
    p.add_argument("--signal-delay", type=int, default=120,
                   help="save and requeue this many seconds before the time limit")  # fmt: skip


def resource_request(flags: argparse.Namespace, **fields: object) -> JobRequest:
    """The :class:`JobRequest` of the flags of :func:`add_resource_arguments`, and ``fields``."""
    return JobRequest(
        nodes=flags.nodes, gpus_per_node=flags.gpus_per_node, tasks_per_node=flags.tasks_per_node,
        partition=flags.partition, timeout_min=flags.timeout, cpus_per_task=flags.cpus_per_task,
        mem_gb=flags.mem, account=flags.account, qos=flags.qos, constraint=flags.constraint,
        signal_delay_s=flags.signal_delay, **fields,
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = ToolParser(description=__doc__)
    p.add_argument("--entry", default="pretrain", choices=sorted(ENTRIES))
    p.add_argument("--config-file", default="")
    add_resource_arguments(p)
    p.add_argument("--job-name", default="lorac")
    p.add_argument("--job-dir", default="", help="submitit folder (default OUTPUT_DIR/submitit)")
    p.add_argument("--dry-run", action="store_true", help="print, do not submit")
    p.add_argument("--local", action="store_true", help="run on this machine (submitit local)")
    # the rest: config overrides (KEY VALUE ...), or the tool's own flags for other entries
    args, rest = p.parse_known_args(argv)
    unknown = unknown_option(p, rest) if args.entry == "pretrain" else None
    if unknown:  # pretraining takes no flags besides these: a mistyped one
        p.error(unknown_option_message(p, unknown))
    return args, rest


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args, rest = parse_args(argv)
    req = resource_request(args, entry=args.entry, config_file=args.config_file, args=rest,
                           job_name=args.job_name, job_dir=args.job_dir)  # fmt: skip
    if args.dry_run:
        print(dry_run_text(req, local=args.local), end="")
        return 0
    job = submit(req, local=args.local)
    print(f"job {job.job_id}: {req.entry} on {req.nodes} node(s) x {req.procs_per_node} "
          f"process(es); log {job.paths.stdout}")  # fmt: skip
    if args.local:
        print(f"finished: {job.results()[0]}")  # rank 0's return value
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
