"""The transcribed paper tables: column names agree with the tools, numbers with the paper.

The LaTeX comparison runs when the paper's source is available (``LORAC_PAPER_TEX``, default the
shared copy); it parses each table's rows independently of the transcription and compares
every cell, footnote marks included.
"""

from __future__ import annotations

import os
import re

import pytest

import transfer.detection.results
from tests.helpers import ROOT
from transfer.analysis.paper_tables import PAPER_TABLES, normalize_name
from transfer.classification.report import LINEAR_COLUMNS, SEMI_COLUMNS
from transfer.classification.transfer_datasets import DATASET_NAMES
from transfer.detection.results import TABLE_HEADER

PAPER_TEX = os.environ.get("LORAC_PAPER_TEX", "/work/shared/paper/000_35a197c5a34005f6.txt")


def test_columns_are_the_tools_columns():
    """A tool's CSV row lines up with the paper's only if the names agree exactly."""
    t = PAPER_TABLES
    assert set(t["table1"].metric_columns) <= set(LINEAR_COLUMNS)
    assert t["table1"].key_column == LINEAR_COLUMNS[0] == t["table5"].key_column
    assert list(t["table2"].metric_columns) == [*DATASET_NAMES.values(), "Average"]
    assert list(t["table3"].metric_columns) == SEMI_COLUMNS[1:]
    assert list(t["table4"].metric_columns) == list(TABLE_HEADER)


def test_detection_is_cited_by_the_papers_number():
    """The collector, its docs and the report give COCO detection the same table number."""
    number = next(t.number for t in PAPER_TABLES.values() if t.latex_label == "tab:detection")
    docs = (ROOT / "docs" / "detection.md").read_text()
    assert docs.startswith(f"# COCO detection, segmentation and keypoints (Table {number})")
    assert f"the paper's Table {number}." in transfer.detection.results.__doc__


def test_table2_averages_match_the_rows():
    """The paper's Average column is the mean of its 12 datasets (to its 0.1 rounding)."""
    table = PAPER_TABLES["table2"]
    for row in table.rows:
        values = [row.values[c] for c in table.metric_columns[:-1]]
        assert abs(sum(values) / 12 - row.values["Average"]) < 0.06, row.name


def _clean(cell: str) -> str:
    cell = re.sub(r"\\(cite|cline)\{[^}]*\}", "", cell)
    cell = cell.replace("$^\\#$", "#").replace("$^\\#", "#").replace("$^\\S$", "§")
    cell = cell.replace("$\\times$", "x").replace("\\slash", "/").replace("\\bf", "")
    cell = re.sub(r"\\(hline|shline)", "", cell)
    return re.sub(r"[{}$~]", "", cell).strip()


def _latex_rows(tex: str, label: str) -> list[list[str]]:
    start = tex.rfind("\\begin{table", 0, tex.index(f"\\label{{{label}}}"))
    body = tex[start : tex.index("\\end{tabular}", start)]
    rows = []
    for line in body.split("\\\\"):
        if "&" not in line or "\\multirow" in line or "\\multicolumn" in line:
            continue
        line = line.split("\\begin{tabular}")[-1].split("}", 1)[-1] if "tabular" in line else line
        cells = [_clean(c) for c in line.split("&")]
        if cells[0] in ("Method", "Model", ""):
            continue
        rows.append(cells)
    return rows


def _same(value, cell: str, mark: str) -> bool:
    if value is None:
        return cell == "/"
    if isinstance(value, float):
        return cell == f"{value:.1f}{mark}"
    return cell.replace(" ", "") == value.replace(" ", "")


@pytest.mark.skipif(not os.path.isfile(PAPER_TEX), reason="paper LaTeX source not available")
def test_numbers_follow_the_order_of_the_papers_tables():
    """LaTeX numbers tables in the order of their environments: Table n is the n-th label."""
    with open(PAPER_TEX, encoding="utf-8") as f:
        tex = f.read()
    labels = re.findall(r"\\label\{(tab:[^}]*)\}", tex)
    assert tex.count("\\begin{table") == len(labels)
    assert {t.number: t.latex_label for t in PAPER_TABLES.values()} == dict(
        enumerate(labels, start=1)
    )


@pytest.mark.skipif(not os.path.isfile(PAPER_TEX), reason="paper LaTeX source not available")
@pytest.mark.parametrize("key", list(PAPER_TABLES))
def test_transcription_matches_the_latex(key):
    with open(PAPER_TEX, encoding="utf-8") as f:
        tex = f.read()
    table = PAPER_TABLES[key]
    latex = _latex_rows(tex, table.latex_label)
    if key == "table5":  # the paper lists models as columns: "Model & ..." rows Top-1 / Top-5
        header = [
            _clean(c) for c in tex[tex.index("Model  &  LORAC") :].split("\\\\")[0].split("&")
        ]
        latex = [[name, *(r[i] for r in latex)] for i, name in enumerate(header) if i > 0]
    assert len(latex) == len(table.rows), [r[0] for r in latex]
    for row, cells in zip(table.rows, latex, strict=True):
        assert normalize_name(row.name).startswith(normalize_name(cells[0])), (row.name, cells)
        for col, cell in zip(table.columns, cells[1:], strict=True):
            assert _same(row.values[col], cell, row.marks.get(col, "")), (row.name, col, cell)
