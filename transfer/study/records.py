"""What the driver adds to a study's records besides the run records: ``invocations.json``, one
entry per invocation of the target that ran something, and the CPU facts the entry and the page
state. The records' layout and their reader are :mod:`transfer.analysis.study_records`."""

from __future__ import annotations

import datetime
import os

from transfer.analysis.study_records import INVOCATIONS, read_json, write_json
from transfer.analysis.study_setup import StudyOptions

__all__ = ["cpu_cores", "log_invocation", "threads_per_run"]


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def threads_per_run(jobs: int) -> int:
    """The torch threads each of ``jobs`` runs at once gets: the driver sets them, the page
    states them."""
    return max(1, (os.cpu_count() or 1) // jobs)


def log_invocation(opt: StudyOptions, wall_seconds: float, runs_done: int) -> list[dict]:
    """Append this invocation (when it ran anything) to ``<records>/invocations.json`` and
    return them all, so a page rewritten from the records keeps the target's wall time."""
    if not opt.records:
        return []
    path = os.path.join(opt.records, INVOCATIONS)
    logged = read_json(path)["invocations"] if os.path.isfile(path) else []
    if runs_done:
        logged.append(
            {
                "finished": datetime.datetime.now().isoformat(timespec="seconds"),
                "minutes": round(wall_seconds / 60, 1),
                "runs_done": runs_done,
                "jobs": opt.jobs,
                "cpu_cores": cpu_cores(),
            }
        )
        os.makedirs(opt.records, exist_ok=True)
        write_json(path, {"invocations": logged})
    return logged
