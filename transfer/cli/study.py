"""`make study`: pretrain LORAC, MoCo-M and MoCo-v2 at demo scale with several seeds, evaluate each
checkpoint (kNN, linear probe, test nuclear norm) and write a results page with a plot; or run one
of the paper's experiments (--experiment) on a SLURM cluster.

  python tools/study.py --output-dir output/study --results docs/results.md   # make study
  python tools/study.py --seeds 0 --methods lorac mocom -- SOLVER.MAX_ITER 20   # a quick look
  python tools/study.py --sweep beta --seeds 0 1 2 -- SOLVER.EPOCHS 2.0   # Fig. 3: study-beta
  python tools/study.py --sweep views --seeds 0 1 2 -- SOLVER.EPOCHS 2.0  # Fig. 4b: study-views
  # Fig. 3 on ImageNet-100 as SLURM jobs (docs/cluster.md: every paper table, resources)
  python tools/study.py --experiment in100-beta --executor slurm DATASETS.ROOT /data/in1k/train
  python tools/study.py --experiment in100-beta --dry-run ...   # every sbatch script
  python tools/study.py --experiment in100-beta --status ...    # every run's state

The page goes to <output-dir>/results.md unless --results names another file (the Makefile's
full targets write docs/). `--` ends a list option (--seeds, --methods) before the overrides.

Interrupted? Run the same command again: finished runs (study.json) are skipped, an unfinished
one resumes from its last checkpoint, which Ctrl-C or SIGTERM (``kill``) makes every run in
progress save first (exit status 128 + the signal). With --executor slurm every run is a
pretraining job and an evaluation job after it; running again submits only what is neither done
nor queued (a failed run again) and writes the page of the runs done, naming the others with
their state; `--status` shows them (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from pretrain.cli.arguments import ToolParser, options_from_args
from pretrain.cli.overrides import parse_args_and_overrides
from pretrain.cli.submit_pretrain import add_resource_arguments, resource_request
from pretrain.cli.user_errors import exit_on_user_error
from pretrain.cluster.submit import JobRequest
from pretrain.config import load_config
from pretrain.utils.output_dir import check_output_dir
from transfer.study import METHODS, StudyError, StudyInterrupted, StudyOptions, run_study
from transfer.study.experiments import EXPERIMENTS, Experiment, experiment_methods

__all__ = ["main", "parse_args", "status_command"]

_SWEEP_EXPERIMENTS = {"": "study", "beta": "study-beta", "views": "study-views"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = StudyOptions()
    p = ToolParser(description=__doc__)
    p.add_argument(
        "--experiment",
        choices=list(EXPERIMENTS),
        default="",
        help="one of the paper's experiments (default: study, or the --sweep's)",
    )
    p.add_argument("--output-dir", help="run directories go here (default output/EXPERIMENT)")
    p.add_argument("--results", help="Markdown page, plots beside it (OUTPUT_DIR/results.md)")
    p.add_argument("--seeds", type=int, nargs="+", help="default: the experiment's")
    p.add_argument(
        "--methods", nargs="+", help=f"of {list(METHODS)} (default: all, or the sweep's)"
    )
    p.add_argument(
        "--sweep",
        choices=("beta", "views"),
        default="",
        help="beta: paper Fig. 3; views: the M ablation (Fig. 4b), at demo scale",
    )
    p.add_argument(
        "--records", default=d.records, help="keep each run's study.json here too (committed)"
    )
    p.add_argument("--knn-train", type=int, default=d.knn_train, help="kNN reference images")
    p.add_argument("--knn-test", type=int, default=d.knn_test, help="kNN test images")
    p.add_argument(
        "--nuclear-images", type=int, default=d.nuclear_images, help="test images for ||Q_hat||_*"
    )
    p.add_argument("--probe-epochs", type=int, default=d.probe_epochs, help="linear-probe epochs")
    p.add_argument(
        "--jobs", type=int, default=d.jobs, help="runs at once (processes, nproc/jobs threads each)"
    )
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--dry-run", action="store_true", help="print every job's sbatch script")
    p.add_argument("--status", action="store_true", help="print every run's state, run nothing")
    # --executor slurm's job resources (None: the experiment's, docs/cluster.md)
    g = p.add_argument_group("--executor slurm (as tools/submit_pretrain.py)")
    add_resource_arguments(g, nodes=None, gpus_per_node=None)
    p.add_argument("opts", nargs=argparse.REMAINDER, help="pretraining overrides KEY VALUE ...")
    return parse_args_and_overrides(p, argv)  # flags after the overrides too; "--" ends a list


def study_options(args: argparse.Namespace, exp: Experiment, command: str) -> StudyOptions:
    """The study's options for the experiment, its defaults filled in from ``exp``."""
    if args.output_dir is None:
        args.output_dir = os.path.join("output", exp.name.replace("-", "_"))
    args.results = args.results or os.path.join(args.output_dir, "results.md")
    args.seeds = args.seeds or list(exp.seeds)
    first = next(iter(experiment_methods(exp, 0.0).values()))
    epochs = float(load_config(first.config, [str(o) for o in args.opts]).SOLVER.EPOCHS)
    table = experiment_methods(exp, epochs)  # a sweep's warm-up is half of the epochs
    args.methods = args.methods or list(table)
    sweep = exp.sweep if not exp.cluster else ""
    return options_from_args(StudyOptions, args, command=command, method_table=table, sweep=sweep)


def _job_template(args: argparse.Namespace, exp: Experiment) -> JobRequest:
    req = resource_request(args)
    req.nodes = exp.nodes if args.nodes is None else args.nodes
    req.gpus_per_node = exp.gpus_per_node if args.gpus_per_node is None else args.gpus_per_node
    if req.tasks_per_node is None and not req.gpus_per_node:
        req.tasks_per_node = 1
    return req


def status_command(argv: Sequence[str], opts: Sequence[str]) -> str:
    """The command line of ``argv`` that shows its runs' states: ``--status`` goes before the
    trailing overrides ``opts`` (and a ``--`` before them), where it is read as a flag."""
    argv, opts = list(argv), list(opts)
    at = len(argv) - len(opts) if opts and argv[len(argv) - len(opts) :] == opts else len(argv)
    if at and argv[at - 1] == "--":
        at -= 1
    return shlex.join(["python", "tools/study.py", *argv[:at], "--status", *argv[at:]])


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "tools/study.py", *given])
    status_line = status_command(given, args.opts)  # before study_options fills in args
    if args.experiment and args.sweep:
        raise StudyError(f"--sweep {args.sweep} with --experiment: give one of them")
    exp = EXPERIMENTS[args.experiment or _SWEEP_EXPERIMENTS[args.sweep]]
    opt = study_options(args, exp, command)
    if not (args.dry_run or args.status):  # the folders it writes, checked before anything runs
        check_output_dir(opt.output_dir, "--output-dir", StudyError, owner="study")
        check_output_dir(opt.records, "--records", StudyError, optional=True)  # "": none kept
        results_dir = os.path.dirname(opt.results)  # "": the working directory
        check_output_dir(results_dir, "--results' folder", StudyError, optional=True)
    if args.executor == "slurm" or args.dry_run or args.status:
        from transfer.study.config import load_experiment_configs
        from transfer.study.slurm import plan_runs, run_on_slurm

        cfgs = load_experiment_configs(exp, opt)
        planned = plan_runs(exp, opt, cfgs, _job_template(args, exp))
        return run_on_slurm(exp, opt, planned, args.dry_run, args.status, status_line)
    if exp.cluster:
        raise StudyError(
            f"--experiment {exp.name} is an ImageNet experiment for a cluster: add "
            "--executor slurm (or --dry-run to see its jobs)"
        )
    try:
        outcomes = run_study(opt)
    except StudyInterrupted as e:
        print(e, file=sys.stderr, flush=True)
        return 128 + e.signum  # as a shell reports a process ended by that signal
    done = sum(o.status == "done" for o in outcomes)
    print(f"{done} run(s) done now, {len(outcomes) - done} skipped; wrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
