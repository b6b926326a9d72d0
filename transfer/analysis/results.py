"""Find the result tables the evaluation and detection tools wrote and sort them by paper table:
each tool's CSV by its file name (``table1_linear.csv`` under an ``--ablation-dir`` is Table 5),
a CSV whose first column is ``pretraining`` and every detection run's ``results.json`` to Table
4, any other CSV to "other result tables". Hidden and ``feature_cache`` folders are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from transfer.analysis import AnalysisError
from transfer.analysis.paper_tables import PAPER_TABLES
from transfer.tables import CsvTable, read_csv

__all__ = ["FoundRow", "Results", "collect_results"]

_BY_NAME = {
    "table1_linear.csv": "table1",
    "table2_transfer.csv": "table2",
    "table3_semi.csv": "table3",
    "knn.csv": "knn",
}
# Extra CSV column names accepted for a paper column (the tool's name differs from the paper's).
ALIASES = {"train. epoch": ("epochs",)}


@dataclass
class FoundRow:
    """One model's row from a result file: ``values`` maps paper columns to text cells."""

    name: str
    values: dict[str, str]
    source: str  # the file it came from


@dataclass
class Results:
    rows: dict[str, list[FoundRow]] = field(default_factory=dict)  # paper table key -> rows
    sources: dict[str, list[str]] = field(default_factory=dict)  # table key -> files
    other: list[CsvTable] = field(default_factory=list)  # knn.csv and unknown CSVs


def _walk(root: str, pattern_ext: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "feature_cache")
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(pattern_ext)]
    return found


def _paper_rows(table: CsvTable, key: str) -> list[FoundRow]:
    """Rows of a tool's CSV restricted to the paper table's columns, numbers validated."""
    paper = PAPER_TABLES[key]
    if paper.key_column not in table.columns:
        raise AnalysisError(
            f"{table.path}: expected a {paper.key_column!r} column for paper Table {paper.number}"
            f", found {table.columns}"
        )
    rows = []
    for i, row in enumerate(table.rows):
        values = {}
        for col in paper.columns:
            name = next((c for c in (col, *ALIASES.get(col, ())) if c in table.columns), None)
            if name is None or row[name] == "":
                continue
            if col in paper.metric_columns:
                table.number(i, name)  # raises on a non-number
            values[col] = row[name]
        rows.append(FoundRow(row[paper.key_column], values, table.path))
    return rows


def _classify(path: str, table: CsvTable, ablation: bool) -> str:
    name = os.path.basename(path)
    if name == "table1_linear.csv" and ablation:
        return "table5"
    if name in _BY_NAME:
        return _BY_NAME[name]
    if table.columns and table.columns[0] == "pretraining":
        return "table4"
    return "other"


def _detection_runs(root: str) -> tuple[list[FoundRow], list[str]]:
    from transfer.detection.results import TABLE_HEADER, build_table, read_run

    runs = []
    for path in _walk(root, "results.json"):
        if os.path.basename(path) != "results.json":
            continue
        try:  # read_run would fail on bad JSON with a message that does not name the file
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except json.JSONDecodeError as e:
            raise AnalysisError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        try:
            runs.append(read_run(os.path.dirname(path)))
        except (KeyError, TypeError, AttributeError, StopIteration) as e:
            raise AnalysisError(f"{path}: not a detection results file (bad key {e})") from None
    if not runs:
        return [], []
    labels, values = build_table(runs)  # a ResultsError is an AnalysisError
    rows = [
        FoundRow(
            label,
            {c: f"{v:.3f}" for c, v in zip(TABLE_HEADER, row, strict=True) if v is not None},
            root,
        )  # .3f as the collector CSV, so the same run dedupes
        for label, row in zip(labels, values, strict=True)
    ]
    return rows, [r.run_dir for r in runs]


def collect_results(
    eval_dirs: Sequence[str] = (),
    detection_dirs: Sequence[str] = (),
    ablation_dirs: Sequence[str] = (),
) -> Results:
    """Read every result file under the folders; a folder that does not exist is an error."""
    res = Results()
    groups = [(d, False) for d in (*eval_dirs, *detection_dirs)] + [
        (d, True) for d in ablation_dirs
    ]
    for root, ablation in groups:
        if not os.path.isdir(root):
            raise AnalysisError(f"{root}: results folder not found")
        for path in _walk(root, ".csv"):
            table = read_csv(path)
            kind = _classify(path, table, ablation)
            if kind in PAPER_TABLES:
                res.rows.setdefault(kind, []).extend(_paper_rows(table, kind))
                res.sources.setdefault(kind, []).append(path)
            else:
                res.other.append(table)
    for root in detection_dirs:
        rows, run_dirs = _detection_runs(root)
        if rows:
            res.rows.setdefault("table4", []).extend(rows)
            res.sources.setdefault("table4", []).extend(run_dirs)
    for key, rows in res.rows.items():  # a collector CSV and its run folders give the same rows
        unique: list[FoundRow] = []
        for r in rows:
            if not any(u.name == r.name and u.values == r.values for u in unique):
                unique.append(r)
        res.rows[key] = unique
    return res
