"""The study's last step: log this invocation in the records, gather what the page states about
it (when, how long, on what machine) and have the analysis layer draw the plots
(:mod:`transfer.analysis.study_figures`) and write the page (:mod:`transfer.analysis.study_page`).
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Mapping, Sequence

from pretrain.utils.atomic_io import atomic_write_bytes
from transfer.analysis.study_figures import write_plots
from transfer.analysis.study_page import Invocation, render_page
from transfer.analysis.study_setup import StudyOptions
from transfer.analysis.study_stats import summarize

from .records import cpu_cores, log_invocation, threads_per_run

__all__ = ["hardware", "write_report"]


def hardware() -> dict[str, str]:
    import torch

    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    cores = cpu_cores()
    return {
        "CPU cores (nproc)": str(cores),
        "CPU model": model,
        "torch": f"{torch.__version__} ({torch.get_num_threads()} threads)",
        "GPU": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none used",
    }


def write_report(
    opt: StudyOptions,
    results: Sequence[Mapping],
    wall_seconds: float,
    runs_done: int | None = None,
    missing: Sequence[str] = (),
) -> str:
    """Write ``opt.results`` (Markdown) and its plots beside it, logging the invocation in the
    records when it ran ``runs_done`` > 0 runs; ``missing``: the runs without a result."""
    invocation = Invocation(
        stamp=datetime.datetime.now().isoformat(timespec="seconds"),
        seconds=wall_seconds,
        runs_done=runs_done,
        logged=log_invocation(opt, wall_seconds, runs_done or 0),
        machine=hardware(),
        threads_per_run=threads_per_run(opt.jobs),
    )
    os.makedirs(os.path.dirname(os.path.abspath(opt.results)), exist_ok=True)
    summaries = summarize(results, opt.methods)
    png = write_plots(opt, summaries, os.path.splitext(opt.results)[0])[0][1]
    atomic_write_bytes(opt.results, render_page(opt, results, png, invocation, missing).encode())
    return png
