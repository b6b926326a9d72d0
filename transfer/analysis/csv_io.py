"""Strict CSV reading and plain CSV writing for the analysis tools.

Reading is strict because a half-written or hand-edited table silently shifted by one column
would put wrong numbers into a report: every row must have exactly the header's fields and
numeric cells must parse. Writing uses the csv module so names with commas stay one cell.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pretrain.errors import LoracError

__all__ = ["AnalysisError", "CsvTable", "format_number", "parse_number", "read_csv", "write_csv"]

# Cells that mean "no value" in the tables this project writes ("" / "-") and in the paper ("/").
MISSING = {"", "-", "–", "/", "nan", "NaN"}


class AnalysisError(LoracError):
    """A file or value the analysis cannot use; the message names the file (and row/key)."""


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
    """``"72.40"`` -> 72.4, ``"72.4%"`` -> 72.4, missing markers -> None; else AnalysisError."""
    text = text.strip()
    if text in MISSING:
        return None
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise AnalysisError(f"{where}: {text!r} is not a number") from None
    if math.isnan(value):
        return None
    return value


def format_number(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def read_csv(path: str) -> CsvTable:
    """Header + rows of ``path``; ragged rows, an empty file or a bad header are errors."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            records = list(csv.reader(f))
    except UnicodeDecodeError:
        raise AnalysisError(f"{path}: not a UTF-8 text CSV file") from None
    except csv.Error as e:
        raise AnalysisError(f"{path}: malformed CSV ({e})") from None
    except OSError as e:
        raise AnalysisError(f"{path}: cannot read ({e.strerror or e})") from None
    records = [r for r in records if any(cell.strip() for cell in r)]
    if not records:
        raise AnalysisError(f"{path}: empty CSV file (no header row)")
    header = [c.strip() for c in records[0]]
    if any(not c for c in header):
        raise AnalysisError(f"{path}: header has an empty column name: {records[0]}")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise AnalysisError(f"{path}: duplicate columns {dupes} in the header")
    rows = []
    for line, record in enumerate(records[1:], start=2):
        if len(record) != len(header):
            raise AnalysisError(
                f"{path}: line {line} has {len(record)} fields, the header has {len(header)}"
            )
        rows.append(dict(zip(header, (c.strip() for c in record), strict=True)))
    return CsvTable(path, header, rows)


def write_csv(path: str, columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> str:
    """Write ``rows`` (dicts, missing keys -> empty) to ``path``; returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="", extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path
