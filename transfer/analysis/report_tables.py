"""The report's and the study pages' tables: text cells plus a kind per row (``paper``, ``ours``,
``missing`` or ``plain``), and the paper's tables with this run's rows beside the paper's."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from transfer.analysis.paper_tables import PaperTable, normalize_name
from transfer.analysis.results import FoundRow
from transfer.analysis.runs import RunData, beta_label
from transfer.tables import CsvTable

__all__ = ["Table", "compare_table", "csv_table", "runs_table"]

NOT_RUN = "not run"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of_rows(
        cls, title: str, columns: Sequence[str], rows: Sequence[Mapping], missing: str = "-"
    ) -> Table:
        """A table of ``rows`` (column -> value) under ``columns``; a cell a row lacks is
        ``missing``, a key that is not a column is left out."""
        table = cls(title, list(columns))
        for row in rows:
            table.add([row.get(c, missing) for c in table.columns])
        return table

    def add(self, cells: Sequence[object], kind: str = "plain") -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])
        self.kinds.append(kind)


def _paper_cell(value: float | str | None, mark: str) -> str:
    if value is None:
        return "/"
    text = f"{value:.1f}" if isinstance(value, float) else str(value)
    return text + mark


def compare_table(paper: PaperTable, found: Sequence[FoundRow], sources: Sequence[str]) -> Table:
    """Paper rows in the paper's order, each followed by this run's rows of the same model;
    the main methods get a "not run" line when absent; other rows of this run come last."""
    columns = list(paper.columns)
    table = Table(
        f"Table {paper.number} ({paper.latex_label}): {paper.title}",
        [paper.key_column, "source", *columns],
    )
    used: set[int] = set()
    for prow in paper.rows:
        table.add(
            [
                prow.name,
                "paper",
                *(_paper_cell(prow.values[c], prow.marks.get(c, "")) for c in columns),
            ],
            "paper",
        )
        matches = [
            i for i, r in enumerate(found) if normalize_name(r.name) == normalize_name(prow.name)
        ]
        for i in matches:
            used.add(i)
            table.add(
                [found[i].name, "this run", *(found[i].values.get(c, "") for c in columns)], "ours"
            )
        if not matches and prow.name in paper.main_rows:
            table.add([prow.name, "this run", *([NOT_RUN] + [""] * (len(columns) - 1))], "missing")
    for i, r in enumerate(found):
        if i not in used:
            table.add([r.name, "this run", *(r.values.get(c, "") for c in columns)], "ours")
    if sources:
        table.notes.append("This run's numbers: " + ", ".join(sorted(set(sources))) + ".")
    else:
        table.notes.append(f"{NOT_RUN}: no result file for this table was found.")
    if any(r.marks for r in paper.rows):
        table.notes.append(
            "Paper marks: # borrowed from Kolesnikov et al. (2019), "
            "§ re-implemented by the authors."
        )
    return table


def csv_table(table: CsvTable, title: str) -> Table:
    out = Table(title, list(table.columns))
    for row in table.rows:
        out.add([row[c] for c in table.columns])
    out.notes.append(f"From {table.path}.")
    return out


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "\u221e"
    return f"{value:.{digits}g}" if abs(value) < 1e-2 else f"{value:.{digits}f}"


def runs_table(runs: Sequence[RunData]) -> Table:
    """One row per pretraining run: its setup and the last logged values."""
    t = Table(
        "Setup and last logged values",
        [
            "run",
            "prior",
            "beta",
            "arch",
            "last iteration",
            "loss",
            "mean ||Q||_*",
            "kNN top-1 (%)",
            "images/s (mean)",
            "notes",
        ],
    )
    for r in runs:
        last_iter = r.records[-1]["iteration"] if r.records else None
        knn = r.last("knn/top1")
        _, speed = r.series("images_per_sec")
        t.add(
            [
                r.label,
                r.cfg("LOSS.PRIOR", ""),
                beta_label(r.beta, True)
                if r.beta is not None and r.prior_never_on
                else _num(r.beta, 2),
                r.cfg("MODEL.ARCH", ""),
                "" if last_iter is None else str(last_iter),
                _num(r.last("total_loss")),
                _num(r.last("nuclear_norm", skip_zero=True)),
                _num(None if knn is None else 100 * knn, 2),
                _num(sum(speed) / len(speed) if speed else None, 1),
                "; ".join(r.notes),
            ]
        )
    return t
