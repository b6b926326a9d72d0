"""``tools/study.py --executor slurm`` (docs/cluster.md): each (method, seed) run of an experiment
is a pretraining job of :mod:`pretrain.cluster.submit` and an evaluation job after it
(``afterok``): the study's own (:func:`.driver.evaluate_and_record`; the last one writes the page)
or ``tools/linear_probe.py``. A run's jobs are those its submitit folders hold
(``<run>/submitit/<job id>``, ``<run>/submitit/evaluate/<job id>``); one ``squeue`` says which are
queued.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fvcore.common.config import CfgNode

from pretrain.cluster.submit import (
    FUNCTION_ENTRY,
    JobRequest,
    build_job,
    check_pretrain_data,
    dry_run_text,
    job_ids,
    queued_jobs,
    submit,
)
from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.locks import exclusive_dir_lock
from transfer.tables import markdown_table, read_csv

from .config import prior_never_on
from .driver import (
    check_same_settings,
    collect_results,
    evaluate_and_record,
    write_page_when_complete,
)
from .experiments import Experiment, StudyError, StudyOptions
from .page import probe_page, write_report
from .records import read_json
from .run import RunPaths, WriteTrainStats, run_config

__all__ = [
    "EvaluateJob",
    "PlannedRun",
    "RunState",
    "check_requests",
    "dry_run",
    "plan_runs",
    "run_on_slurm",
    "run_states",
    "status_table",
    "submit_experiment",
]


@dataclass(frozen=True)
class PlannedRun:
    key: str  # "<method>_seed<k>", the run directory's name
    label: str  # "LORAC β=1 seed 0"
    paths: RunPaths
    cfg: CfgNode  # the run's resolved config (seed and OUTPUT_DIR set)
    pretrain: JobRequest
    evaluate: JobRequest


class EvaluateJob:
    """The evaluation job of one study run: the study's own evaluation of the final checkpoint
    (what a local run does after pretraining), then the page once every run is done."""

    def __init__(self, opt: StudyOptions, cfg: CfgNode, run: RunPaths) -> None:
        self.opt, self.cfg, self.run = opt, cfg, run

    def __repr__(self) -> str:
        return f"the study's evaluation of {self.run.checkpoint} (kNN, linear probe, ||Q_hat||_*)"

    def __call__(self) -> str:
        evaluate_and_record(self.opt, self.cfg, self.run)
        write_page_when_complete(self.opt)
        return self.run.study_json


def _eval_data_root(cfg: CfgNode) -> str:
    """The linear probe's root (``train/`` and ``val/``): DATASETS.ROOT's parent when it is the
    ``train`` folder (as the pretraining commands give it), else DATASETS.ROOT."""
    root = cfg.DATASETS.ROOT.rstrip("/")
    return os.path.dirname(root) if os.path.basename(root) == "train" else root


def _probe_dir(run: RunPaths) -> str:
    return os.path.join(run.dir, "linear")


def _probe_top1(p: PlannedRun) -> float | None:
    """The linear probe's top-1 of an ImageNet run (its Table 1 CSV); None before it ends."""
    path = os.path.join(_probe_dir(p.paths), "table1_linear.csv")
    return read_csv(path).number(0, "Top-1") if os.path.isfile(path) else None


def _evaluation(exp: Experiment, opt: StudyOptions, m: str, cfg: CfgNode, run: RunPaths) -> dict:
    """The evaluation job's own fields: the study's evaluation (one CPU task) or the probe tool."""
    if exp.evaluation.tool == "study":
        job = EvaluateJob(opt, cfg, run)
        return {"entry": FUNCTION_ENTRY, "function": job, "gpus_per_node": 0, "tasks_per_node": 1}
    probe = _probe_dir(run)
    # the classes the run pretrained on (ImageNet-100 from an ImageNet-1K root: its class list)
    classes = ["DATA.CLASS_LIST", cfg.DATASETS.CLASS_LIST] if cfg.DATASETS.CLASS_LIST else []
    return {"entry": "linear_probe", "config_file": exp.evaluation.config_for(m),
            "args": ["--checkpoint", run.checkpoint, "--output-dir", probe, "--table-dir", probe,
                     "--data-root", _eval_data_root(cfg), "--name", opt.method_table[m].label,
                     *classes]}  # fmt: skip


def plan_runs(
    exp: Experiment, opt: StudyOptions, cfgs: dict[str, CfgNode], template: JobRequest
) -> list[PlannedRun]:
    """Every (method, seed) run of ``opt`` with its two job requests (resources from
    ``template``, the ``tools/study.py`` resource options)."""
    planned = []
    for m in opt.methods:
        method = opt.method_table[m]
        for seed in opt.seeds:
            run = RunPaths.of(os.path.abspath(opt.output_dir), m, seed)  # jobs run anywhere
            cfg = run_config(cfgs[m], run)
            key = os.path.basename(run.dir)
            # the study's records need the train stats a local run writes (the page's budget)
            hooks = [WriteTrainStats(run.train_stats)] if exp.evaluation.tool == "study" else []
            pre = dataclasses.replace(
                template, entry="pretrain", config_file=method.config,
                args=[*opt.overrides(m), "SEED", str(seed), "OUTPUT_DIR", run.dir],
                job_name=f"{exp.name}:{key}", job_dir=os.path.join(run.dir, "submitit"),
                extra_hooks=hooks,
            )  # fmt: skip
            ev = dataclasses.replace(
                template, nodes=1, job_name=f"{exp.name}:{key}:eval",
                job_dir=os.path.join(run.dir, "submitit", "evaluate"),
                **_evaluation(exp, opt, m, cfg, run),
            )  # fmt: skip
            label = f"{method.label} seed {seed}"
            planned.append(PlannedRun(key, label, run, cfg, pre, ev))
    return planned


def dry_run(planned: Sequence[PlannedRun]) -> str:
    """Every job's sbatch script and what it waits for; nothing is submitted."""
    out = []
    for p in planned:
        after = f"{{job of {p.key}:pretrain}}"
        out += [
            f"##### {p.key}:pretrain ({p.label}): no dependency",
            dry_run_text(p.pretrain),
            f"##### {p.key}:evaluate: after {p.key}:pretrain (afterok)",
            dry_run_text(dataclasses.replace(p.evaluate, after_ok=[after])),
        ]
    return "\n".join(out)


@dataclass
class RunState:
    run: PlannedRun
    # "done", "pretraining: RUNNING", "evaluation: PENDING", "failed", "not started", or
    # "stopped, resumes" (a checkpoint and no job)
    state: str
    job_id: str = ""
    log: str = ""  # the failed job's stderr

    @property
    def queued(self) -> bool:
        return self.state.startswith(("pretraining", "evaluation"))


def _is_done(p: PlannedRun) -> bool:
    if p.evaluate.entry == FUNCTION_ENTRY:
        return os.path.isfile(p.paths.study_json)
    return _probe_top1(p) is not None


def _latest_jobs(p: PlannedRun) -> tuple[str, str]:
    """The run's last pretraining job and its last evaluation job submitted after it (an older
    one evaluated nothing of the current pretraining), from submitit's folders; "" for none."""
    pre = (job_ids(p.pretrain.job_dir) or [""])[-1]
    ev = (job_ids(p.evaluate.job_dir) or [""])[-1]
    return pre, "" if pre and ev and int(ev) < int(pre) else ev


def run_states(planned: Sequence[PlannedRun]) -> list[RunState]:
    """Each run's state from its files, its job folders and SLURM's queue."""
    queue, states = None, []
    for p in planned:
        pre, ev = _latest_jobs(p)
        if _is_done(p):
            states.append(RunState(p, "done", ev))
            continue
        if not pre and not ev:
            started = "stopped, resumes" if p.paths.has_checkpoint else "not started"
            states.append(RunState(p, started))
            continue
        queue = queued_jobs() if queue is None else queue
        for job, name in ((pre, "pretraining"), (ev, "evaluation")):
            if job in queue:
                states.append(RunState(p, f"{name}: {queue[job]}", job))
                break
        else:  # nothing queued and no result: the job that ended last failed
            trained = os.path.isfile(p.paths.checkpoint)
            if trained and not ev:  # its evaluation job was never taken
                states.append(RunState(p, "stopped, resumes"))
                continue
            job, request = (ev, p.evaluate) if trained else (pre, p.pretrain)
            log = os.path.join(request.job_dir, job, f"{job}_0_log.err") if job else ""
            states.append(RunState(p, "failed", job, log))
    return states


def _last_metrics(p: PlannedRun) -> tuple[str, str]:
    """(last iteration, last metric) of a run, from its metrics.json or its result."""
    if os.path.isfile(p.paths.study_json):
        r = read_json(p.paths.study_json)
        return str(r.get("max_iter", "")), f"linear {r['linear_top1']:.2f}%"
    top1 = _probe_top1(p)
    if top1 is not None:
        return "", f"linear {top1:.2f}%"
    last = {}
    with contextlib.suppress(OSError), open(os.path.join(p.paths.dir, "metrics.json")) as f:
        for line in f:
            with contextlib.suppress(ValueError):  # a line being written
                last.update(json.loads(line))
    loss = last.get("total_loss", last.get("loss"))
    return str(last.get("iteration", "")), "" if loss is None else f"loss {loss:.4f}"


def status_table(states: Sequence[RunState]) -> str:
    """``--status``: run, state, job id, iteration, last metric (and a failed run's log)."""
    rows = []
    for s in states:
        iteration, metric = _last_metrics(s.run)
        state = f"{s.state} (log {s.log})" if s.log else s.state
        rows.append([s.run.key, state, s.job_id or "-", iteration or "-", metric or "-"])
    return markdown_table(["run", "state", "job id", "iteration", "last metric"], rows)


def _check_probe_data(p: PlannedRun) -> None:
    """A linear-probe evaluation's ``train/`` and ``val/``, each with a folder for every class
    of the run's ``DATASETS.CLASS_LIST``."""
    if p.evaluate.entry != "linear_probe":
        return
    from pretrain.engine.launch import check_class_folders

    root = _eval_data_root(p.cfg)
    splits = [os.path.join(root, sub) for sub in ("train", "val")]
    for split in splits:
        if not os.path.isdir(split):
            raise StudyError(
                f"{split}: no such directory, which the linear probe of {p.key} reads (train/ "
                "and val/ under DATASETS.ROOT's parent when DATASETS.ROOT ends in train, else "
                "under DATASETS.ROOT)"
            )
    if p.cfg.DATASETS.CLASS_LIST:
        check_class_folders(splits, p.cfg.DATASETS.CLASS_LIST, "DATASETS.CLASS_LIST")


def check_requests(planned: Sequence[PlannedRun]) -> None:
    """Every job's request and data checked (roots, the kNN monitor's and the probe's ``train/``
    and ``val/``, the class list's folders): refused before anything is written or submitted,
    not in a job after its wait in the queue."""
    for p in planned:
        p.pretrain.check()
        build_job(p.pretrain)
        check_pretrain_data(p.pretrain)
        p.evaluate.check()
        _check_probe_data(p)


def submit_experiment(
    planned: Sequence[PlannedRun], say: Callable[[str], object]
) -> tuple[int, int]:
    """Submit what is neither done nor queued; ``say`` gets one line per run. Returns the number
    of runs submitted now and of those already queued; :func:`check_requests` first."""
    submitted, queued = 0, 0
    for s in run_states(planned):
        p = s.run
        queued += s.queued
        if s.state == "done" or s.queued:
            say(f"{p.key}: {s.state}" + (f" (job {s.job_id}), left alone" if s.queued else ""))
            continue
        why = {
            "failed": f"job {s.job_id} failed (log {s.log}): resubmitted",
            "not started": "submitted",
        }.get(s.state, "submitted, resumes from its checkpoint")
        jobs, after = {}, []
        if not os.path.isfile(p.paths.checkpoint):  # no final checkpoint yet: (re)train first
            jobs["pretrain"] = submit(p.pretrain).job_id
            after = [jobs["pretrain"]]
        else:
            why += ", evaluation only (pretraining finished)"
        jobs["evaluate"] = submit(dataclasses.replace(p.evaluate, after_ok=after)).job_id
        say(f"{p.key}: {why}: " + ", ".join(f"{k} job {v}" for k, v in jobs.items()))
        submitted += 1
    return submitted, queued


def _missing_lines(states: Sequence[RunState]) -> list[str]:
    """A line per run without a result: its state (a queued run's job, a failed run's log)."""
    return [
        f"{s.run.label} (`{s.run.key}`): {s.state}"
        + (f" (job {s.job_id})" if s.queued else "")
        + (f", log `{s.log}`" if s.log else "")
        for s in states
        if s.state != "done"
    ]


def write_page(exp: Experiment, opt: StudyOptions, states: Sequence[RunState]) -> None:
    """The page of the runs that are done, the others listed as missing."""
    missing = _missing_lines(states)
    if exp.evaluation.tool == "study":
        results, _ = collect_results(opt)
        done = [m for m in opt.methods if m in {r["method"] for r in results}]
        write_report(dataclasses.replace(opt, methods=done), results, 0.0, 0, missing)
        return
    top1: dict[str, list[tuple[int, float]]] = {}
    for s in (s for s in states if s.state == "done"):
        top1.setdefault(s.run.paths.method, []).append((s.run.paths.seed, _probe_top1(s.run)))
    os.makedirs(os.path.dirname(os.path.abspath(opt.results)), exist_ok=True)
    atomic_write_bytes(opt.results, probe_page(exp, opt, top1, missing).encode())


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
    cfgs = {p.paths.method: p.cfg for p in planned}
    check_same_settings(opt, cfgs)  # as a local study: no run of other settings is reused
    queued_jobs()  # SLURM answers: asked before anything is written
    if not exp.cluster:  # a budget that ends before the prior turns on: said before the queue
        late = prior_never_on(opt, cfgs)
        if late:
            print(f"warning: {late}")
    os.makedirs(opt.output_dir, exist_ok=True)
    with exclusive_dir_lock(opt.output_dir, "--output-dir", "study", ".study.lock", StudyError):
        submitted, queued = submit_experiment(planned, print)
        _write_partial_page(exp, opt, planned)
    shows = f"`{status_line}`" if status_line else "--status"
    print(f"{submitted} run(s) submitted now, {queued} already queued; {shows} shows them")
    return 0
