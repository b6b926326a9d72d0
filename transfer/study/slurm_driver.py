"""``--executor slurm``, ``--dry-run`` and ``--status`` of ``tools/study.py``: one invocation's
steps over the jobs of :mod:`.slurm` (plan, look, submit what is missing, write the page)."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

from pretrain.cluster.submit import queued_jobs
from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.locks import exclusive_dir_lock
from transfer.analysis.study_page import missing_section
from transfer.analysis.study_setup import StudyError, StudyOptions

from .config import prior_never_on
from .driver import collect_results, write_page_when_complete
from .experiments import Experiment
from .report import write_report
from .slurm import (
    PlannedRun,
    RunState,
    check_requests,
    dry_run,
    run_states,
    status_table,
    submit_experiment,
)

__all__ = ["run_on_slurm"]


def _missing_lines(states: Sequence[RunState]) -> list[str]:
    """A line per run without a result: its state (a queued run's job, a failed run's log)."""
    return [
        f"{s.run.label} (`{s.run.key}`): {s.state}"
        + (f" (job {s.job_id})" if s.queued else "")
        + (f", log `{s.log}`" if s.log else "")
        for s in states
        if s.state != "done"
    ]


def _probe_top1(p: PlannedRun) -> float:
    with open(os.path.join(p.paths.dir, "linear", "table1_linear.csv")) as f:
        return float(next(csv.DictReader(f))["Top-1"])


def _probe_page(exp: Experiment, opt: StudyOptions, states: Sequence[RunState]) -> str:
    """An ImageNet experiment's page: linear top-1 per method, mean ± sample std over the seeds
    that are done, every seed's value, and the missing runs."""
    import numpy as np

    from transfer.tables import markdown_table

    rows = []
    for m in opt.methods:
        done = [s for s in states if s.run.paths.method == m and s.state == "done"]
        values = [_probe_top1(s.run) for s in done]
        std = f"{np.std(values, ddof=1):.2f}" if len(values) > 1 else "n/a"
        mean = f"{np.mean(values):.2f} ± {std}" if values else "-"
        seeds = ", ".join(f"{s.run.paths.seed}: {v:.2f}" for s, v in zip(done, values, strict=True))
        rows.append([opt.method_table[m].label, f"{len(values)}/{len(opt.seeds)}", mean, seeds])
    table = markdown_table(["method", "seeds done", "linear top-1 (%)", "per seed"], rows)
    return "\n".join([
        f"# {exp.name}: paper {exp.paper}, linear top-1",
        "",
        f"Written by `{opt.command}`; mean ± sample standard deviation (ddof = 1) over seeds.",
        "",
        *missing_section(_missing_lines(states)),
        "",
        table,
        *(["", "Later evaluations (their own tools):", *(f"- {t}" for t in exp.evaluation.later)]
          if exp.evaluation.later else []),
        "",
    ])  # fmt: skip


def write_page(exp: Experiment, opt: StudyOptions, states: Sequence[RunState]) -> None:
    """The page of the runs that are done, the others listed as missing."""
    if exp.evaluation.tool == "study":
        results, _ = collect_results(opt)
        done = {r["method"] for r in results}
        shown = StudyOptions(**{**vars(opt), "methods": [m for m in opt.methods if m in done]})
        write_report(shown, results, 0.0, 0, _missing_lines(states))
        return
    os.makedirs(os.path.dirname(os.path.abspath(opt.results)), exist_ok=True)
    atomic_write_bytes(opt.results, _probe_page(exp, opt, states).encode())


def _write_partial_page(exp: Experiment, opt: StudyOptions, planned: Sequence[PlannedRun]) -> None:
    """The page of the runs that are done, the others named with their state as it is after
    this invocation's submissions (a run submitted now is queued, not "not started")."""
    states = run_states(planned)
    if not any(s.state == "done" for s in states):
        return
    write_page(exp, opt, states)
    left = sum(s.state != "done" for s in states)
    print(f"wrote {opt.results}" + (f" ({left} run(s) missing)" if left else ""))
    # the last evaluation job writes the whole page when it ends; had it ended after the states
    # above were read, this page would hide its result: write the whole page then
    if left and exp.evaluation.tool == "study" and write_page_when_complete(opt):
        print(f"wrote {opt.results} (every run done)")


def run_on_slurm(
    exp: Experiment,
    opt: StudyOptions,
    planned: Sequence[PlannedRun],
    dry_run_only: bool = False,
    status: bool = False,
    status_line: str = "",
) -> int:
    """``--dry-run``: print every job; ``--status``: print every run's state; else submit what
    is neither done nor queued (under the study's lock) and write the page of what is done,
    naming the others with their state. ``status_line``: the command that shows the states
    (``--status`` before the overrides), printed at the end."""
    if dry_run_only:
        if exp.hours:
            print(
                f"# {exp.name} (paper {exp.paper}): {len(planned)} runs; a pretraining job at the "
                f"paper's scale takes about {exp.hours:g} h (an estimate, docs/cluster.md)"
            )
        print(dry_run(planned))
        return 0
    if status:
        print(status_table(run_states(planned)))
        return 0
    check_requests(planned)
    queued_jobs()  # SLURM answers: asked before anything is written
    if not exp.cluster:  # a budget that ends before the prior turns on: said before the queue
        late = prior_never_on(opt, {p.paths.method: p.cfg for p in planned})
        if late:
            print(f"warning: {late}")
    os.makedirs(opt.output_dir, exist_ok=True)
    with exclusive_dir_lock(opt.output_dir, "--output-dir", "study", ".study.lock", StudyError):
        submitted, queued = submit_experiment(planned, print)
        _write_partial_page(exp, opt, planned)
    shows = f"`{status_line}`" if status_line else "--status"
    print(f"{submitted} run(s) submitted now, {queued} already queued; {shows} shows them")
    return 0
