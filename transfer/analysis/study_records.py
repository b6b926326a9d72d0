"""The committed run records of a study (``--records DIR``, e.g. ``docs/results_runs/beta``):
one ``<method>_seed<k>.json`` per finished run (its ``study.json``) and :data:`INVOCATIONS`, the
wall time of every invocation of the target that ran something.

:func:`read_json` and :func:`write_json` are the one reader and writer of the study's JSON files
(records, ``study.json``, ``train_stats.json``); :func:`load_records` reads a folder back into
the study's options and results, so that a page or the report (``tools/make_report.py
--study-records``) shows a study without its run directories.
"""

from __future__ import annotations

import json
import os
import re

from pretrain.utils.atomic_io import atomic_write_bytes
from transfer.analysis.study_setup import METHODS, StudyError, StudyOptions, sweep_methods

__all__ = ["INVOCATIONS", "load_records", "read_json", "write_json"]

INVOCATIONS = "invocations.json"
_RECORD = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)\.json$")
_NEEDED = ("method", "seed", "label", "knn_top1", "linear_top1", "nuclear_mean", "epochs")


def write_json(path: str, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict:
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None


def _sweep_of(methods: set[str]) -> str:
    if any(m.startswith("lorac_beta") for m in methods):
        return "beta"
    if any(m.startswith(("lorac_M", "mocom_M")) for m in methods):
        return "views"
    return ""


def _read_record(path: str, method: str, seed: int) -> dict:
    """One run record, checked: valid JSON, the keys a page needs, the method and seed its
    name says."""
    try:
        record = read_json(path)
    except ValueError as e:
        raise StudyError(str(e)) from None
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
    """The study options (sweep, method table, methods and seeds found) and the results of the
    records in ``records_dir``. Raises :class:`StudyError` naming the folder or file when there
    are no records, a record is not valid JSON or lacks a key, or a method is unknown."""
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
