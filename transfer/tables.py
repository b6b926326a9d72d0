"""Markdown and CSV tables: the one writer and reader of every table the project writes.

Markdown tables are GitHub tables laid out by ``tabulate``, compact (``| a | b |``, cells not
padded to the column width: some cells are sentences, as in ``docs/checkpoints.md``, and a table
row stays one readable diff line) with each column's alignment in the separator row
(``|:---|---:|``). CSV files go through the ``csv`` module, so names with commas stay one cell,
and are read back strictly: a hand-edited or half-written table shifted by one column would put
wrong numbers into a report, so every row must have exactly the header's fields.

Results tables (one row per model, :func:`update_table`) are a CSV file with a Markdown twin;
running a tool again for another model adds a row, for the same model updates its row. A row
keyed by its model (:class:`RowOwner`: a ``weights sha256`` cell) is never updated with another
model's results: a row of the same name holding other weights, or written before rows were keyed,
is a :class:`RowClashError` (nothing written) unless the caller asks to replace it. A figure
is keyed by the data it was computed on too (``sources``: column -> dataset, root, split,
protocol; kept as JSON in the CSV's :data:`SOURCES_COLUMN`): a cell holding a figure of other
data, or of data it does not record, is never overwritten, it is the same error.

No torch here: ``tools/collect_detection_results.py`` writes tables without importing it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tabulate import DataRow, TableFormat, tabulate

from pretrain.utils.errors import ResultsError

__all__ = [
    "METHOD_COLUMN",
    "MISSING",
    "SOURCES_COLUMN",
    "WEIGHTS_COLUMN",
    "CsvTable",
    "RowClashError",
    "RowOwner",
    "check_row",
    "data_source",
    "markdown_table",
    "parse_number",
    "read_csv",
    "update_table",
    "write_csv",
    "write_markdown",
]

# Cells that mean "no value" in the tables this project writes ("" / "-" / "–") and in the
# paper ("/").
MISSING = {"", "-", "–", "/", "nan", "NaN"}

Row = Mapping[str, object] | Sequence[object]
# The cells of a results row that say whose it is (RowOwner): the pretraining method its run's
# config names and a short hash of the weights evaluated, which keys the row.
METHOD_COLUMN = "config method"
WEIGHTS_COLUMN = "weights sha256"
# The CSV cell (not shown in the Markdown twin) that says what data each figure of a results row
# was computed on: a JSON object, column -> source.
SOURCES_COLUMN = "computed on"
CLASH_HINT = "name this model's row differently, or replace that row"
_SEPARATOR = {"left": ":---", "right": "---:", "center": ":---:", None: "---"}


def _compact_format(aligns: Sequence[str | None]) -> TableFormat:
    # tabulate's "github"/"pipe" formats pad every cell to its column's width; this one keeps
    # their row syntax without the padding (stralign/numalign None, cells as given) and marks
    # the alignment in the separator, which tabulate calls with (widths, aligns) it does not
    # know here.
    def separator(_widths: list[int], _aligns: list[str]) -> str:
        return "|" + "|".join(_SEPARATOR[a] for a in aligns) + "|"

    row = DataRow("|", "|", "|")
    return TableFormat(None, separator, None, None, row, row, 1, None)


def _cells(columns: Sequence[str], row: Row, missing: str) -> list[str]:
    values = [row.get(c) for c in columns] if isinstance(row, Mapping) else list(row)
    if len(values) != len(columns):
        raise ValueError(f"{len(values)} cells for {len(columns)} columns: {values}")
    return [missing if v is None or v == "" else str(v) for v in values]


def markdown_table(
    columns: Sequence[str],
    rows: Sequence[Row],
    *,
    align: str | None | Sequence[str | None] = None,
    missing: str = "",
) -> str:
    """A Markdown table (ending with a newline) of ``rows``: mappings from column to value or
    sequences in column order. ``align`` is one alignment (``"left"``, ``"right"``,
    ``"center"`` or None: unmarked) for every column or one per column; empty and None cells
    are written as ``missing``."""
    aligns = [align] * len(columns) if align is None or isinstance(align, str) else list(align)
    if len(aligns) != len(columns):
        raise ValueError(f"{len(aligns)} alignments for {len(columns)} columns")
    body = [_cells(columns, r, missing) for r in rows]
    text = tabulate(
        body,
        headers=list(columns),
        tablefmt=_compact_format(aligns),
        stralign=None,
        numalign=None,
        disable_numparse=True,
        preserve_whitespace=True,
    )
    return text + "\n"


def write_markdown(
    path: str,
    columns: Sequence[str],
    rows: Sequence[Row],
    *,
    title: str = "",
    align: str | None | Sequence[str | None] = None,
    missing: str = "",
) -> str:
    """Write :func:`markdown_table`, under a ``# title`` heading if given; returns ``path``."""
    head = f"# {title}\n\n" if title else ""
    _makedirs_for(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + markdown_table(columns, rows, align=align, missing=missing))
    return path


def write_csv(path: str, columns: Sequence[str], rows: Sequence[Row]) -> str:
    """Write ``rows`` (mappings, missing keys and None -> empty; or sequences) to ``path``."""
    for r in rows:
        if isinstance(r, Mapping) and (extra := [k for k in r if k not in columns]):
            raise ValueError(f"{path}: row keys {extra} are not among the columns {columns}")
    _makedirs_for(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(_cells(columns, r, "") for r in rows)
    return path


def _makedirs_for(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


@dataclass
class CsvTable:
    path: str
    columns: list[str]
    rows: list[dict[str, str]]

    def number(self, row_index: int, column: str) -> float | None:
        """The cell as a float (``None`` when empty); raises naming file, row and column."""
        text = self.rows[row_index].get(column, "")
        return parse_number(text, f"{self.path}: row {row_index + 1}, column {column!r}")


def parse_number(text: str, where: str) -> float | None:
    """``"72.40"`` -> 72.4, ``"72.4%"`` -> 72.4, :data:`MISSING` -> None; else ResultsError."""
    text = text.strip()
    if text in MISSING:
        return None
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise ResultsError(f"{where}: {text!r} is not a number") from None
    if math.isnan(value):
        return None
    return value


def read_csv(path: str) -> CsvTable:
    """Header + rows of ``path``; ragged rows, an empty file or a bad header are errors."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            records = list(csv.reader(f))
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not a UTF-8 text CSV file") from None
    except csv.Error as e:
        raise ResultsError(f"{path}: malformed CSV ({e})") from None
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from None
    records = [r for r in records if any(cell.strip() for cell in r)]
    if not records:
        raise ResultsError(f"{path}: empty CSV file (no header row)")
    header = [c.strip() for c in records[0]]
    if any(not c for c in header):
        raise ResultsError(f"{path}: header has an empty column name: {records[0]}")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise ResultsError(f"{path}: duplicate columns {dupes} in the header")
    rows = []
    for line, record in enumerate(records[1:], start=2):
        if len(record) != len(header):
            raise ResultsError(
                f"{path}: line {line} has {len(record)} fields, the header has {len(header)}"
            )
        rows.append(dict(zip(header, (c.strip() for c in record), strict=True)))
    return CsvTable(path, header, rows)


class RowClashError(ResultsError):
    """A results row of the same name that holds, or may hold, another model's results."""


@dataclass(frozen=True)
class RowOwner:
    """The model a results row belongs to: the row's name, the pretraining method its run's
    config names (``""``: not known) and the short hash of its weights (``""``: the row is not
    keyed, and any row of the same name is updated as before rows were keyed)."""

    name: str
    method: str = ""
    weights: str = ""

    def cells(self, key: str, name: str | None = None) -> dict[str, str]:
        """The row's identifying cells: ``key`` (the table's name column) holds ``name`` (default:
        :attr:`name`), then the method and the weights hash when keyed."""
        out = {key: self.name if name is None else name}
        if self.weights:
            out |= {METHOD_COLUMN: self.method, WEIGHTS_COLUMN: self.weights}
        return out


def _sources(path: str, row: Mapping[str, str]) -> dict[str, str]:
    """The row's :data:`SOURCES_COLUMN`: column -> what its figure was computed on."""
    text = row.get(SOURCES_COLUMN, "")
    try:
        held = json.loads(text) if text else {}
    except ValueError:
        held = None
    if not isinstance(held, dict) or not all(isinstance(v, str) for v in held.values()):
        raise ResultsError(f"{path}: {SOURCES_COLUMN!r} cell {text!r} is not a JSON object")
    return held


def _clash(
    path: str,
    key: str,
    rows: Sequence[Mapping[str, str]],
    new: Mapping[str, object],
    hint: str,
    sources: Mapping[str, str],
) -> tuple[int, RowClashError | None]:
    """The index of ``new``'s row among ``rows`` (-1: none) and, when that row may hold another
    model's results or a figure of other data in a column of ``sources``, the error saying so."""
    name, mine = str(new[key]), str(new.get(WEIGHTS_COLUMN) or "")
    for i, r in enumerate(rows):
        if r.get(key) != name:
            continue
        theirs = r.get(WEIGHTS_COLUMN, "")
        if mine and theirs != mine:
            held = (
                f"holds another model's results ({WEIGHTS_COLUMN} {theirs}, this model's {mine})"
                if theirs
                else f"was written without a {WEIGHTS_COLUMN} and may hold another model's "
                f"results (this model's is {mine})"
            )
            return i, RowClashError(f"{path}: row {name!r} {held}; {hint}")
        held_on = _sources(path, r)
        for column, source in sources.items():
            if r.get(column, "") and held_on.get(column) != source:
                was = held_on.get(column, "data it does not record")
                return i, RowClashError(
                    f"{path}: row {name!r} holds {column!r} {r[column]} computed on {was}, this "
                    f"run's is computed on {source}; {hint}"
                )
        return i, None
    return -1, None


def data_source(dataset: str, root: str, class_list: str = "", *details: str) -> str:
    """What a results figure was computed on (a value of ``sources``): the dataset, its absolute
    root, its class list and the ``details`` that make it another figure (split file,
    protocol); empty ones left out."""
    classes = f"classes {os.path.abspath(class_list)}" if class_list else ""
    return " ".join(d for d in (dataset, os.path.abspath(root), classes, *details) if d)


def check_row(
    csv_path: str,
    key: str,
    row: Mapping[str, object],
    *,
    replace: bool = False,
    hint: str = CLASH_HINT,
    sources: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`RowClashError` if :func:`update_table` would refuse ``row`` (named by its
    ``key`` column) with figures of ``sources`` in ``csv_path``: run before the work whose
    results go there. A table that cannot be read raises :class:`ResultsError` here too."""
    if replace or not os.path.isfile(csv_path):
        return
    _, error = _clash(csv_path, key, read_csv(csv_path).rows, row, hint, sources or {})
    if error:
        raise error


def update_table(
    csv_path: str,
    columns: Sequence[str],
    row: Mapping[str, object],
    title: str = "",
    *,
    replace: bool = False,
    hint: str = CLASH_HINT,
    sources: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """Merge ``row`` into the row of ``csv_path`` with the same first-column value (or append
    it), rewrite the CSV and its Markdown twin ``<same name>.md`` (first column left-aligned,
    the others right, empty cells "-"); columns beyond ``columns`` found in the file or the row
    are kept. Returns the rows.

    A row with a :data:`WEIGHTS_COLUMN` cell is keyed by it: a row of that name holding another
    hash, or none, raises :class:`RowClashError` (``hint`` says how to resolve it) and nothing is
    written; so does a column of ``sources`` (column -> the data its figure was computed on)
    whose cell holds a figure of other data. With ``replace`` that row is replaced, none of its
    cells kept. The sources are kept in the CSV only (:data:`SOURCES_COLUMN`, last)."""
    key = columns[0]
    if key not in row:
        raise ValueError(f"row needs the key column {key!r}")
    old = read_csv(csv_path) if os.path.isfile(csv_path) else CsvTable(csv_path, [], [])
    rows = old.rows
    cols = list(columns)
    cols += [c for c in old.columns if c not in cols]
    cols += [c for c in row if c not in cols]
    new = {k: "" if v is None else str(v) for k, v in row.items()}
    sources = dict(sources or {})
    index, clash = _clash(csv_path, key, rows, new, hint, sources)
    if clash and not replace:
        raise clash
    if index < 0:
        rows.append(new)
        index = len(rows) - 1
    elif clash:
        rows[index] = new
    else:
        held = _sources(csv_path, rows[index])
        rows[index].update({k: v for k, v in new.items() if v != ""})
        sources = held | sources
    if sources:
        rows[index][SOURCES_COLUMN] = json.dumps(sources, ensure_ascii=False)
    cols = [c for c in cols if c != SOURCES_COLUMN]
    md_cols = list(cols)
    if any(r.get(SOURCES_COLUMN) for r in rows):
        cols.append(SOURCES_COLUMN)
    rows = [{c: r.get(c, "") for c in cols} for r in rows]  # every column in every row
    write_csv(csv_path, cols, rows)
    aligns = ["left"] + ["right"] * (len(md_cols) - 1)
    md_path = os.path.splitext(csv_path)[0] + ".md"
    write_markdown(md_path, md_cols, rows, title=title, align=aligns, missing="-")
    return rows
