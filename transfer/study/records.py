"""The committed run records of a study (``--records DIR``, e.g. ``docs/results_runs/beta``):
one ``<method>_seed<k>.json`` per finished run (its ``study.json``) and :data:`INVOCATIONS`, one
entry per invocation that ran something with the CPU facts the page states. :func:`load_records`
reads a folder back, so a page or the report shows a study without its run directories;
:func:`read_json` / :func:`write_json` are the study's one JSON reader and writer.
"""

from __future__ import annotations

import datetime
import json
import os
import re

from pretrain.utils.atomic_io import atomic_write_bytes

from .experiments import METHODS, StudyError, StudyOptions, sweep_methods

__all__ = [
    "INVOCATIONS",
    "cpu_cores",
    "load_records",
    "log_invocation",
    "read_json",
    "record_name",
    "threads_per_run",
    "write_json",
]

INVOCATIONS = "invocations.json"
_RECORD = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)\.json$")
_NEEDED = ("method", "seed", "label", "knn_top1", "linear_top1", "nuclear_mean", "epochs")


def record_name(method: str, seed: int) -> str:
    """The file name of a finished run's record, as :func:`load_records` reads it back."""
    return f"{method}_seed{seed}.json"


def write_json(path: str, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict:
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise StudyError(f"{path}: not valid JSON ({e})") from None


def _sweep_of(methods: set[str]) -> str:
    if any(m.startswith("lorac_beta") for m in methods):
        return "beta"
    if any(m.startswith(("lorac_M", "mocom_M")) for m in methods):
        return "views"
    return ""


def _read_record(path: str, method: str, seed: int) -> dict:
    """One run record: valid JSON, the keys a page needs, the method and seed its name says."""
    record = read_json(path)
    missing = [k for k in _NEEDED if k not in record]
    if missing:
        raise StudyError(f"{path}: not a study record, missing {missing}")
    if (record["method"], record["seed"]) != (method, seed):
        raise StudyError(
            f"{path}: holds method {record['method']!r} seed {record['seed']}, "
            "not what its name says"
        )
    return record


def load_records(records_dir: str) -> tuple[StudyOptions, list[dict]]:
    """The study options (sweep, methods and seeds found) and the results of the records in
    ``records_dir``; :class:`StudyError` naming the folder or file for a bad or unknown one."""
    if not os.path.isdir(records_dir):
        raise StudyError(f"{records_dir}: no such folder of study records")
    results = [
        _read_record(os.path.join(records_dir, name), match["method"], int(match["seed"]))
        for name in sorted(os.listdir(records_dir))
        if (match := _RECORD.match(name))
    ]
    if not results:
        raise StudyError(f"{records_dir}: no study records (<method>_seed<k>.json) in it")
    present = {r["method"] for r in results}
    sweep = _sweep_of(present)
    table = sweep_methods(sweep, float(results[0]["epochs"])) if sweep else dict(METHODS)
    unknown = sorted(present - set(table))
    if unknown:
        raise StudyError(f"{records_dir}: unknown methods {unknown}; known: {list(table)}")
    opt = StudyOptions(
        seeds=tuple(sorted({int(r["seed"]) for r in results})),
        methods=tuple(m for m in table if m in present),
        sweep=sweep,
        records=records_dir,
        method_table=table,
    )
    return opt, results


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
