"""The study's loop over (method, seed) runs: resume, progress with an ETA, then the report."""

from __future__ import annotations

import datetime
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from types import FrameType

from fvcore.common.config import CfgNode

from pretrain.config.resume import RESUME_MAY_CHANGE, changed_values, read_saved_config
from pretrain.utils.locks import exclusive_dir_lock
from pretrain.utils.run_owner import record_owner

from .config import load_method_configs, prior_never_on
from .experiments import StudyError, StudyOptions
from .page import write_report
from .records import read_json, record_name, threads_per_run, write_json
from .run import LOGGERS, RunPaths, evaluate_run, pretrain_run, run_config, run_log

__all__ = [
    "RunOutcome",
    "StudyInterrupted",
    "check_same_settings",
    "collect_results",
    "evaluate_and_record",
    "run_study",
    "write_page_when_complete",
]

logger = logging.getLogger(__name__)

_STOPS = (signal.SIGINT, signal.SIGTERM)


class StudyInterrupted(Exception):
    """SIGINT (Ctrl-C) or SIGTERM stopped the study: the runs it was training saved a checkpoint
    at their next iteration and resume from it when the same command runs again.
    ``resumable``: the runs (``"LORAC seed 0"``) with a checkpoint and no result yet."""

    def __init__(self, signum: int, resumable: list[str]) -> None:
        super().__init__(signum, resumable)  # the args pickle it across --jobs processes
        self.signum = signum
        self.resumable = resumable

    def __str__(self) -> str:
        runs = ", ".join(self.resumable) or "none"
        return (
            f"study stopped by {signal.Signals(self.signum).name}; runs that resume from their "
            f"last checkpoint: {runs}. Run the same command again to go on."
        )


@dataclass
class RunOutcome:
    method: str
    seed: int
    status: str  # "skipped" (study.json existed) or "done" (trained and/or evaluated now)
    seconds: float
    result: dict


# A run to do: (its index among all runs, from 1; its paths; its config; its log-line head).
_Pending = tuple[int, RunPaths, CfgNode, str]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _eta(spent: list[float], left: int, at_once: int = 1) -> str:
    """ETA of ``left`` runs, ``at_once`` at a time: the rounds left x the mean wall time of the
    runs done by this invocation."""
    if not left:
        return "no runs left"
    if not spent:
        return f"{left} run(s) left, ETA unknown"
    rounds = -(-left // at_once)
    return f"{left} run(s) left, ETA {_minutes(rounds * sum(spent) / len(spent))}"


# Set in each --jobs worker by _init_worker: the driver's "stop" (a multiprocessing Event).
_stop_event = None


def _log_to(output_dir: str) -> None:
    from detectron2.utils.logger import setup_logger

    for name in LOGGERS:
        setup_logger(output_dir, name=name)


def _init_worker(stop_event: EventType, threads: int, output_dir: str) -> None:
    """A ``--jobs`` worker: its share of torch's threads, the study's loggers; SIGINT (sent to
    the whole process group) left to the driver, which answers it with a SIGTERM each: the
    trainer saves a checkpoint at its next iteration, where a KeyboardInterrupt would lose the
    steps since the last one. ``stop_event``: no run after it."""
    import torch

    global _stop_event
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    _log_to(output_dir)
    _stop_event = stop_event


def _do_run(opt: StudyOptions, cfg: CfgNode, run: RunPaths) -> dict:
    """Pretrain (resuming) and evaluate one run, unless the study stopped first."""
    if _stop_event is not None and _stop_event.is_set():
        raise StudyInterrupted(signal.SIGTERM, [])  # handed to this worker before the stop
    return evaluate_and_record(opt, cfg, run)


def evaluate_and_record(opt: StudyOptions, cfg: CfgNode, run: RunPaths) -> dict:
    """Pretrain ``run`` (resuming; nothing when its checkpoint is final, as after its SLURM
    pretraining job) and evaluate it; write its study.json and record and return the result."""
    start = time.perf_counter()
    with run_log(run.dir):
        train = pretrain_run(cfg, run)
        metrics = evaluate_run(cfg, run, opt)
    # The trainers' hooks form reference cycles that keep their loaders' workers alive: free them
    gc.collect()
    result = {
        "method": run.method,
        "label": opt.method_table[run.method].label,
        "seed": run.seed,
        "config": os.path.relpath(opt.method_table[run.method].config),
        "overrides": opt.overrides(run.method),
        **train,
        **metrics,
        "eval_seconds": sum(metrics[k] for k in metrics if k.endswith("_seconds")),
        "invocation_seconds": time.perf_counter() - start,
        "eval_settings": opt.eval_settings(),
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    write_json(run.study_json, result)
    _keep_record(opt, run, result)  # as soon as it exists: the next session may lack the run
    return result


def collect_results(opt: StudyOptions) -> tuple[list[dict], list[RunPaths]]:
    """The results of the runs that are done (their study.json, or their record) in the
    study's order, and the runs that are not."""
    runs = [RunPaths.of(opt.output_dir, m, s) for m in opt.methods for s in opt.seeds]
    done = {run: _result_file(opt, run) for run in runs}
    return [read_json(p) for p in done.values() if p], [run for run, p in done.items() if not p]


def write_page_when_complete(opt: StudyOptions) -> bool:
    """Write the page when every run is done (the last SLURM evaluation job does it)."""
    results, missing = collect_results(opt)
    if missing:
        return False
    write_report(opt, results, 0.0, 0)
    return True


def _record_path(opt: StudyOptions, run: RunPaths) -> str:
    """Where ``opt.records`` keeps this run's study.json ("" without records)."""
    return os.path.join(opt.records, record_name(run.method, run.seed)) if opt.records else ""


def _result_file(opt: StudyOptions, run: RunPaths) -> str:
    """The run's study.json, else its record; "" when the run is not done."""
    return next((p for p in (run.study_json, _record_path(opt, run)) if os.path.isfile(p)), "")


def _keep_record(opt: StudyOptions, run: RunPaths, result: dict) -> None:
    if opt.records:
        os.makedirs(opt.records, exist_ok=True)
        write_json(_record_path(opt, run), result)


def _log_done(head: str, r: dict, eta: str) -> None:
    logger.info(
        f"{head}: done in {_minutes(r['invocation_seconds'])} (kNN {r['knn_top1']:.2f}%, "
        f"linear {r['linear_top1']:.2f}%, ||Q_hat||_* {r['nuclear_mean']:.3f}); {eta}"
    )


def run_study(opt: StudyOptions) -> list[RunOutcome]:
    """Run every (method, seed) without a ``study.json`` (resuming from its last checkpoint),
    then write ``opt.results`` and its plot. ``opt.jobs`` > 1 runs go at once, each in its own
    process with an equal share of the threads (a demo ResNet-18 gains little from a second)."""
    study_start = time.perf_counter()
    cfgs = load_method_configs(opt)  # every check before anything runs
    check_same_settings(opt, cfgs)  # runs of other overrides are not reused as these
    os.makedirs(opt.output_dir, exist_ok=True)
    # a second study in the same folder would train the same runs into the same checkpoints
    with exclusive_dir_lock(opt.output_dir, "--output-dir", "study", ".study.lock", StudyError):
        record_owner(opt.output_dir, "study")
        _log_to(opt.output_dir)
        runs = [RunPaths.of(opt.output_dir, m, s) for m in opt.methods for s in opt.seeds]
        outcomes: dict[int, RunOutcome] = {}
        pending: list[_Pending] = []
        for i, run in enumerate(runs, 1):
            head = f"[{i}/{len(runs)}] {opt.method_table[run.method].label} seed {run.seed}"
            done = _result_file(opt, run)
            if not done:
                pending.append((i, run, run_config(cfgs[run.method], run), head))
                continue
            result = read_json(done)
            if not os.path.isfile(_record_path(opt, run)):  # --records given after the run
                _keep_record(opt, run, result)
            logger.info("%s: skipped, %s exists", head, done)
            outcomes[i] = RunOutcome(run.method, run.seed, "skipped", 0.0, result)

        training = {run.method for _, run, _, _ in pending}
        late = prior_never_on(opt, {m: cfgs[m] for m in opt.methods if m in training})
        if late:  # runs to train that would be MoCo-M under another name
            logger.warning(late)
        if opt.jobs <= 1:
            _run_sequentially(opt, pending, outcomes)
        elif pending:
            _run_in_parallel(opt, pending, outcomes)
        ordered = [outcomes[i] for i in sorted(outcomes)]
        runs_done = sum(o.status == "done" for o in ordered)
        write_report(opt, [o.result for o in ordered], time.perf_counter() - study_start, runs_done)
        logger.info("wrote %s and its plot", opt.results)
        return ordered


def _pairs(overrides: object) -> dict[str, str]:
    items = [str(o) for o in overrides] if isinstance(overrides, list) else []
    return dict(zip(items[::2], items[1::2], strict=False))


def _differences(old: dict, new: dict) -> list[str]:
    """``KEY old (now new)`` for each key whose value differs between ``old`` and ``new``."""
    return [
        f"{k} {old.get(k, '(not set)')} (now {new.get(k, 'not set')})"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]


def _run_differences(opt: StudyOptions, cfgs: dict[str, CfgNode], method: str, seed: int) -> list:
    """How the run ``(method, seed)`` already in ``opt.output_dir`` (or ``opt.records``) was made
    differently from what ``opt`` asks: its overrides and evaluation settings (a finished run's
    study.json or record), or its config (an unfinished run's config.yaml)."""
    run = RunPaths.of(opt.output_dir, method, seed)
    done = _result_file(opt, run)
    if done:
        result = read_json(done)
        found = []  # a record without them (written by hand, or a test's) is not compared
        if "overrides" in result:
            found += _differences(_pairs(result["overrides"]), _pairs(opt.overrides(method)))
        if "eval_settings" in result:
            found += _differences(result["eval_settings"], opt.eval_settings())
        return found
    saved = read_saved_config(run.dir)  # None: nothing trained yet
    if saved is None:
        return []
    changes = changed_values(saved, run_config(cfgs[method], run), RESUME_MAY_CHANGE)
    return [f"{k} {old} (now {new})" for k, (old, new) in changes.items()]


def check_same_settings(opt: StudyOptions, cfgs: dict[str, CfgNode]) -> None:
    """:class:`StudyError` when a run the study would skip or resume was made with other
    overrides or evaluation settings than ``opt``'s (``cfgs``: :func:`load_method_configs`):
    its results would be reused as if made with these, and the page would mix the two. One line
    naming each difference once; reads only."""
    found = [_run_differences(opt, cfgs, m, s) for m in opt.methods for s in opt.seeds]
    differ = dict.fromkeys(d for run in found for d in run)  # each once, in order
    if differ:
        where = f"--output-dir {opt.output_dir}" + (
            f" (or --records {opt.records})" if opt.records else ""
        )
        raise StudyError(
            f"{where} holds {sum(map(bool, found))} run(s) of this study made with other settings: "
            f"{'; '.join(differ)}. Give these settings another --output-dir (and --records); "
            "the same settings resume the study, and more --seeds or --methods with them add runs"
        )


class _Stops:
    """While the runs go: the first SIGINT or SIGTERM is recorded and calls ``on_first`` (which
    asks the running runs to save a checkpoint and stop); later ones only wait. Installed in the
    main thread only: Python delivers signals there alone."""

    def __init__(self) -> None:
        self.signum, self.previous = 0, {}
        self.on_first: Callable[[], None] = lambda: None

    def __enter__(self) -> _Stops:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self) for sig in _STOPS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            return  # a second Ctrl-C while the runs save: keep waiting for them
        self.signum = signum
        logger.warning(
            "%s: the runs in progress save a checkpoint at their next iteration and stop",
            signal.Signals(signum).name,
        )
        self.on_first()


def _resumable(opt: StudyOptions, pending: list[_Pending]) -> list[str]:
    """The pending runs that have a checkpoint and no study.json (they resume from it)."""
    return [
        f"{opt.method_table[run.method].label} seed {run.seed}"
        for _, run, _, _ in pending
        if run.has_checkpoint and not os.path.isfile(run.study_json)
    ]


# ``outcomes``: by run number, the skipped runs' already in; each run done adds its own
def _run_sequentially(
    opt: StudyOptions, pending: list[_Pending], outcomes: dict[int, RunOutcome]
) -> None:
    """One run after another in this process. SIGINT or SIGTERM while training: the trainer
    saves a checkpoint at the next iteration; while evaluating: stop at once (it runs again on
    resume)."""
    from pretrain.engine.hooks import Preempted

    spent: list[float] = []  # seconds of the runs done by this invocation
    with _Stops() as stop:

        def on_first() -> None:
            if signal.getsignal(signal.SIGTERM) is stop:  # not training: nothing to save
                raise StudyInterrupted(stop.signum, _resumable(opt, pending))
            os.kill(os.getpid(), signal.SIGTERM)  # training: the trainer's handler takes it

        stop.on_first = on_first
        for k, (i, run, cfg, head) in enumerate(pending):
            if stop.signum:  # it came during a run's last iteration, which then finished
                raise StudyInterrupted(stop.signum, _resumable(opt, pending))
            _starting(run, head, _eta(spent, len(pending) - k))
            try:
                result = _do_run(opt, cfg, run)
            except Preempted:
                signum = stop.signum or signal.SIGTERM
                raise StudyInterrupted(signum, _resumable(opt, pending)) from None
            spent.append(result["invocation_seconds"])
            outcomes[i] = RunOutcome(run.method, run.seed, "done", spent[-1], result)
            _log_done(head, result, _eta(spent, len(pending) - k - 1))


def _run_in_parallel(
    opt: StudyOptions, pending: list[_Pending], outcomes: dict[int, RunOutcome]
) -> None:
    """``opt.jobs`` runs at once in spawned workers. On SIGINT/SIGTERM or a failed run every
    worker gets a SIGTERM (:func:`_init_worker`), the queued runs are cancelled and the driver
    waits for the workers: no run goes on training after the study has stopped."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    spent: list[float] = []
    ctx = mp.get_context("spawn")
    stop_event, threads = ctx.Event(), threads_per_run(opt.jobs)
    init = (stop_event, threads, opt.output_dir)
    others = set(mp.active_children())  # children that are not the pool's (a test's, say)

    def halt() -> None:
        stop_event.set()
        for fut in futures:
            fut.cancel()  # those not handed to a worker yet
        for child in set(mp.active_children()) - others:  # the pool's workers
            child.terminate()

    with (
        ProcessPoolExecutor(
            opt.jobs, mp_context=ctx, initializer=_init_worker, initargs=init
        ) as pool,
        _Stops() as stop,
    ):
        futures = {pool.submit(_do_run, opt, c, r): (i, r, h) for i, r, c, h in pending}
        stop.on_first = halt
        for _, run, _, head in pending[: opt.jobs]:
            _starting(run, head, f"{opt.jobs} runs at once, {threads} thread(s) each")
        try:
            for fut in as_completed(futures):
                i, run, head = futures[fut]
                if fut.cancelled():
                    continue
                if fut.exception() is not None:
                    if stop.signum:
                        continue  # stopped (a checkpoint is on disk) or never started
                    raise fut.exception()
                result = fut.result()
                outcomes[i] = RunOutcome(run.method, run.seed, "done", 0.0, result)
                spent.append(result["invocation_seconds"])
                _log_done(head, result, _eta(spent, len(pending) - len(spent), opt.jobs))
        except BaseException:
            if not stop.signum:
                logger.error("a run failed: stopping the others (each saves a checkpoint)")
                halt()
            raise
    if stop.signum:
        raise StudyInterrupted(stop.signum, _resumable(opt, pending))


def _starting(run: RunPaths, head: str, eta: str) -> None:
    how = "resuming from its last checkpoint" if run.has_checkpoint else "pretraining"
    logger.info("%s: %s in %s; %s", head, how, run.dir, eta)
