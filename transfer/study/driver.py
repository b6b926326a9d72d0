"""The study's loop over (method, seed) runs: resume, progress with an ETA, then the report."""

from __future__ import annotations

import datetime
import gc
import logging
import os
import time
from dataclasses import dataclass

from fvcore.common.config import CfgNode

from .config import StudyOptions, load_method_configs
from .report import write_report
from .run import RunPaths, evaluate_run, pretrain_run, read_json, run_log, write_json

__all__ = ["RunOutcome", "run_study"]

logger = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    method: str
    seed: int
    status: str  # "skipped" (study.json existed) or "done" (trained and/or evaluated now)
    seconds: float
    result: dict


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _left(runs: list[RunPaths]) -> int:
    return sum(1 for r in runs if not os.path.isfile(r.study_json))


def _eta(spent: list[float], left: int) -> str:
    """ETA of ``left`` runs: the mean wall time of the runs done by this invocation x left."""
    if not left:
        return "no runs left"
    if not spent:
        return f"{left} run(s) left, ETA unknown"
    return f"{left} run(s) left, ETA {_minutes(left * sum(spent) / len(spent))}"


def _do_run(
    opt: StudyOptions, cfg: CfgNode, run: RunPaths, label: str, settings: dict, threads: int = 0
) -> dict:
    """Pretrain (resuming) and evaluate one run, write its study.json; returns the result.

    ``threads`` > 0 (a worker of ``--jobs``): set torch's intra-op threads and the loggers of
    this fresh process first.
    """
    if threads:
        import torch
        from detectron2.utils.logger import setup_logger

        torch.set_num_threads(threads)
        for name in ("pretrain", "detectron2", "transfer", "fvcore"):
            setup_logger(opt.output_dir, name=name)
    start = time.perf_counter()
    with run_log(run.dir):
        train = pretrain_run(cfg, run)
        metrics = evaluate_run(cfg, run, opt)
    # The trainers' hooks form reference cycles that keep their data loaders, and so their
    # (persistent) worker processes, alive until a collection: free them before the next run.
    gc.collect()
    result = {
        "method": run.method,
        "label": label,
        "seed": run.seed,
        "config": os.path.relpath(opt.method_table[run.method].config),
        "overrides": list(opt.opts),
        **train,
        **metrics,
        "eval_seconds": sum(metrics[k] for k in metrics if k.endswith("_seconds")),
        "invocation_seconds": time.perf_counter() - start,
        "eval_settings": settings,
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    write_json(run.study_json, result)
    return result


def _log_done(head: str, result: dict, eta: str) -> None:
    logger.info(
        "%s: done in %s (kNN %.2f%%, linear %.2f%%, ||Q_hat||_* %.3f); %s",
        head,
        _minutes(result["invocation_seconds"]),
        result["knn_top1"],
        result["linear_top1"],
        result["nuclear_mean"],
        eta,
    )


def run_study(opt: StudyOptions) -> list[RunOutcome]:
    """Run every (method, seed) not yet done, then write ``opt.results`` and its plot.

    A run with ``study.json`` is skipped; a run with checkpoints but no ``study.json`` resumes
    training from its last checkpoint (no training if it is final) and is evaluated. With
    ``opt.jobs`` > 1 that many runs go at once, each in its own process with an equal share of
    the CPU's threads (a ResNet-18 at demo size gains little from a second thread).
    """
    from detectron2.utils.logger import setup_logger

    study_start = time.perf_counter()
    cfgs = load_method_configs(opt)  # every check before anything runs
    os.makedirs(opt.output_dir, exist_ok=True)
    for name in ("pretrain", "detectron2", "transfer", "fvcore"):
        setup_logger(opt.output_dir, name=name)
    runs = [RunPaths.of(opt.output_dir, m, s) for m in opt.methods for s in opt.seeds]
    settings = opt.eval_settings()
    outcomes: dict[int, RunOutcome] = {}
    pending: list[tuple[int, RunPaths, object, str]] = []
    for i, run in enumerate(runs, 1):
        label = opt.method_table[run.method].label
        head = f"[{i}/{len(runs)}] {label} seed {run.seed}"
        if os.path.isfile(run.study_json):
            result = read_json(run.study_json)
            if result.get("eval_settings") != settings:
                logger.warning(
                    "%s: %s was evaluated with other settings (%s, now %s); kept as it is: "
                    "delete it to evaluate again",
                    head,
                    run.study_json,
                    result.get("eval_settings"),
                    settings,
                )
            logger.info("%s: skipped, %s exists", head, run.study_json)
            outcomes[i] = RunOutcome(run.method, run.seed, "skipped", 0.0, result)
            continue
        cfg = cfgs[run.method].clone()
        cfg.defrost()
        cfg.merge_from_list(["SEED", run.seed, "OUTPUT_DIR", run.dir])
        cfg.freeze()
        pending.append((i, run, cfg, head))

    def starting(run: RunPaths, head: str, eta: str) -> None:
        has_ckpt = os.path.isfile(os.path.join(run.dir, "last_checkpoint"))
        how = "resuming from its last checkpoint" if has_ckpt else "pretraining"
        logger.info("%s: %s in %s; %s", head, how, run.dir, eta)

    spent: list[float] = []  # seconds of the runs done by this invocation
    if opt.jobs <= 1:
        for k, (i, run, cfg, head) in enumerate(pending):
            starting(run, head, _eta(spent, len(pending) - k))
            label = opt.method_table[run.method].label
            result = _do_run(opt, cfg, run, label, settings)
            spent.append(result["invocation_seconds"])
            outcomes[i] = RunOutcome(run.method, run.seed, "done", spent[-1], result)
            _log_done(head, result, _eta(spent, len(pending) - k - 1))
    elif pending:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        threads = max(1, (os.cpu_count() or 1) // opt.jobs)
        with ProcessPoolExecutor(opt.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {}
            for i, run, cfg, head in pending:
                label = opt.method_table[run.method].label
                args = (opt, cfg, run, label, settings, threads)
                futures[pool.submit(_do_run, *args)] = (i, run, head)
            for _, run, _, head in pending[: opt.jobs]:
                starting(run, head, f"{opt.jobs} runs at once, {threads} thread(s) each")
            for done, fut in enumerate(as_completed(futures), 1):
                i, run, head = futures[fut]
                result = fut.result()
                outcomes[i] = RunOutcome(run.method, run.seed, "done", 0.0, result)
                spent.append(result["invocation_seconds"])
                left = len(pending) - done
                # runs go opt.jobs at a time: rounds left x the mean wall time of a run so far
                rounds = -(-left // opt.jobs)
                eta = f"{left} run(s) left, ETA {_minutes(rounds * sum(spent) / len(spent))}"
                _log_done(head, result, eta if left else "no runs left")
    ordered = [outcomes[i] for i in sorted(outcomes)]
    write_report(opt, [o.result for o in ordered], time.perf_counter() - study_start)
    logger.info("wrote %s and its plot", opt.results)
    return ordered
