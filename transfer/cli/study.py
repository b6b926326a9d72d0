"""`make study`: pretrain LORAC, MoCo-M and MoCo-v2 at demo scale with several seeds, evaluate each
checkpoint (kNN, linear probe, test nuclear norm) and write a results page with a plot.

  python tools/study.py --output-dir output/study --results docs/results.md
  python tools/study.py --seeds 0 --methods lorac mocom SOLVER.MAX_ITER 20   # a quick look
  python tools/study.py --sweep beta --seeds 0 1 2 SOLVER.EPOCHS 2.0   # Fig. 3: make study-beta
  python tools/study.py --sweep views --seeds 0 1 2 SOLVER.EPOCHS 2.0  # Fig. 4b: study-views

Interrupted? Run the same command again: finished runs (study.json) are skipped and an unfinished
one resumes from its last checkpoint. Ctrl-C or SIGTERM (``kill``) makes every run in progress
save a checkpoint at its next iteration first; the tool then exits with status 128 + the signal.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from pretrain.cli.user_errors import exit_on_user_error
from pretrain.config import load_config
from transfer.analysis.study_setup import SWEEPS, sweep_methods
from transfer.cli.common import options_from_args, tool_parser
from transfer.study import METHODS, StudyInterrupted, StudyOptions, run_study

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = StudyOptions()
    p = tool_parser(__doc__)
    p.add_argument("--output-dir", help=f"run directories go here (default {d.output_dir}[_SWEEP])")
    p.add_argument(
        "--results",
        help=f"Markdown report, plots beside it (default {d.results}, or docs/results_SWEEP.md)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=list(d.seeds))
    p.add_argument(
        "--methods", nargs="+", help=f"of {list(METHODS)} (default: all, or the sweep's)"
    )
    p.add_argument(
        "--sweep",
        choices=SWEEPS,
        default="",
        help="beta: paper Fig. 3; views: the M ablation (Fig. 4b)",
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
    p.add_argument("opts", nargs=argparse.REMAINDER, help="pretraining overrides KEY VALUE ...")
    return p.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "tools/study.py", *(sys.argv[1:] if argv is None else argv)])
    d = StudyOptions()
    suffix = f"_{args.sweep}" if args.sweep else ""
    args.output_dir = args.output_dir or d.output_dir + suffix
    args.results = args.results or d.results.replace(".md", f"{suffix}.md")
    if args.sweep:
        # the sweep's warm-up is half of the epochs the overrides (or the demo config) set
        demo = load_config(METHODS["lorac"].config, [str(o) for o in args.opts])
        table = sweep_methods(args.sweep, float(demo.SOLVER.EPOCHS))
        args.methods = args.methods or list(table)
        opt = options_from_args(StudyOptions, args, command=command, method_table=table)
    else:
        args.methods = args.methods or list(METHODS)
        opt = options_from_args(StudyOptions, args, command=command)
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
