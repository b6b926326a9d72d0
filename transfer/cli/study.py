"""`make study`: pretrain LORAC, MoCo-M and MoCo-v2 at demo scale with several seeds, evaluate each
checkpoint (kNN, linear probe, test nuclear norm) and write a results page with a plot.

  python tools/study.py --output-dir output/study --results docs/results.md
  python tools/study.py --seeds 0 --methods lorac mocom SOLVER.MAX_ITER 20   # a quick look

Interrupted? Run the same command again: finished runs (study.json) are skipped and an unfinished
one resumes from its last checkpoint. Ctrl-C or SIGTERM (``kill``) makes every run in progress
save a checkpoint at its next iteration first; the tool then exits with status 128 + the signal.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from pretrain.cli.user_errors import exit_on_user_error
from transfer.cli.common import options_from_args, tool_parser
from transfer.study import METHODS, StudyInterrupted, StudyOptions, run_study

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = StudyOptions()
    p = tool_parser(__doc__)
    p.add_argument("--output-dir", default=d.output_dir, help="run directories go here")
    p.add_argument("--results", default=d.results, help="Markdown report (plot: same name .png)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(d.seeds))
    p.add_argument("--methods", nargs="+", default=list(d.methods), help=f"of {list(METHODS)}")
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
