"""The one table writer/reader (transfer/tables.py) and metrics.json reader
(transfer/metrics_json.py) every tool and report uses."""

from __future__ import annotations

import json
import re

import pytest

from pretrain.utils.errors import ResultsError
from transfer.metrics_json import read_metrics_json
from transfer.tables import markdown_table, read_csv, update_table, write_csv


def test_markdown_table_is_compact_with_alignment_in_the_separator():
    text = markdown_table(
        ["Model", "Top-1", "note"],
        [{"Model": "LORAC", "Top-1": "73.20"}, ["MoCo, v2", 71.1, None]],
        align=["left", "right", None],
        missing="-",
    )
    assert text == (
        "| Model | Top-1 | note |\n"
        "|:---|---:|---|\n"
        "| LORAC | 73.20 | - |\n"
        "| MoCo, v2 | 71.1 | - |\n"
    )
    assert markdown_table(["a"], []) == "| a |\n|---|\n"
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        markdown_table(["a"], [[1, 2]])


def test_update_table_merges_rows_by_the_first_column(tmp_path):
    path = tmp_path / "t" / "table.csv"
    update_table(str(path), ["Model", "Top-1"], {"Model": "A, x", "Top-1": "1.00"}, "Title")
    update_table(str(path), ["Model", "Top-1"], {"Model": "B", "extra": 3})
    rows = update_table(str(path), ["Model", "Top-1"], {"Model": "A, x", "Top-1": "2.00"})
    assert [(r["Model"], r["Top-1"], r["extra"]) for r in rows] == [
        ("A, x", "2.00", ""),
        ("B", "", "3"),
    ]
    assert read_csv(str(path)).columns == ["Model", "Top-1", "extra"]
    assert (tmp_path / "t" / "table.md").read_text() == (
        "| Model | Top-1 | extra |\n|:---|---:|---:|\n| A, x | 2.00 | - |\n| B | - | 3 |\n"
    )  # the title of the first call is not kept: each call gives its own


def test_csv_reading_is_strict_and_writing_refuses_unknown_keys(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Model,Top-1\nA,1.0\nB,2.0,extra\n")
    with pytest.raises(ResultsError, match=r"t\.csv: line 3 has 3 fields, the header has 2"):
        read_csv(str(path))
    path.write_text("Model,Top-1\nA,high\n")
    with pytest.raises(ResultsError, match=r"t\.csv: row 1, column 'Top-1': 'high' is not a"):
        read_csv(str(path)).number(0, "Top-1")
    with pytest.raises(ValueError, match=r"\['Top-5'\] are not among the columns"):
        write_csv(str(path), ["Model"], [{"Model": "A", "Top-5": 1}])


def test_metrics_json_merges_repeated_iterations_and_names_bad_lines(tmp_path):
    path = tmp_path / "metrics.json"
    lines = [
        {"iteration": 3, "total_loss": 2.0, "beta": float("inf")},
        {"iteration": 1, "total_loss": 3.0},
        {"iteration": 3, "total_loss": 1.5},  # logged again after a resume: the later wins
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    records = read_metrics_json(str(path))
    assert [r["iteration"] for r in records] == [1, 3]
    assert records[1] == {"iteration": 3, "total_loss": 1.5, "beta": float("inf")}
    with open(path, "a") as f:
        f.write('{"iteration": 4, "total_loss"\n')
    with pytest.raises(ResultsError, match=r"metrics\.json: line 5 is not JSON"):
        read_metrics_json(str(path))
    path.write_text('{"total_loss": 1.0}\n')
    with pytest.raises(ResultsError, match="line 1 is not an object with an 'iteration'"):
        read_metrics_json(str(path))


def test_keyed_rows_update_only_their_own_model(tmp_path):
    """Proves: rows carrying a weights hash (RowOwner) merge only with the row of the same name
    and hash; a row of the same name holding another hash, or none (a table written before rows
    were keyed), is a RowClashError naming both and the hint, with nothing written; check_row
    says so up front; replace swaps the whole row; an unkeyed row updates as before."""
    from transfer.tables import (
        WEIGHTS_COLUMN,
        RowClashError,
        RowOwner,
        check_row,
    )

    path = tmp_path / "table.csv"
    cols = ["Model", "Top-1", "Top-5"]
    a, b = RowOwner("run", "LORAC", "aaaa0000"), RowOwner("run", "MoCo-M", "bbbb1111")
    update_table(str(path), cols, {"Top-1": "1.00", **a.cells("Model")})
    rows = update_table(str(path), cols, {"Top-5": "5.00", **a.cells("Model")})
    assert [(r["Top-1"], r["Top-5"], r["config method"]) for r in rows] == [
        ("1.00", "5.00", "LORAC")
    ]
    before = (path.read_bytes(), (tmp_path / "table.md").read_bytes())
    clash = (
        "table.csv: row 'run' holds another model's results (weights sha256 aaaa0000, this "
        "model's bbbb1111); use X"
    )
    with pytest.raises(RowClashError, match=re.escape(clash)):
        check_row(str(path), "Model", b.cells("Model"), hint="use X")
    with pytest.raises(RowClashError, match="holds another model's"):
        update_table(str(path), cols, {"Top-1": "9.00", **b.cells("Model")})
    assert (path.read_bytes(), (tmp_path / "table.md").read_bytes()) == before
    check_row(str(path), "Model", b.cells("Model"), replace=True)
    check_row(str(path), "Model", b.cells("Model", "run 2"))
    check_row(str(tmp_path / "none.csv"), "Model", b.cells("Model"))
    rows = update_table(str(path), cols, {"Top-1": "9.00", **b.cells("Model")}, replace=True)
    assert [(r["Top-1"], r["Top-5"], r[WEIGHTS_COLUMN]) for r in rows] == [("9.00", "", "bbbb1111")]
    rows = update_table(str(path), cols, {"Model": "run", "Top-5": "7.00"})  # not keyed
    assert [(r["Top-1"], r["Top-5"], r[WEIGHTS_COLUMN]) for r in rows] == [
        ("9.00", "7.00", "bbbb1111")
    ]

    old = tmp_path / "old.csv"
    old.write_text("Model,Top-1\nrun,90.48\nother,1.00\n")
    with pytest.raises(RowClashError, match=f"row 'run' was written without a {WEIGHTS_COLUMN}"):
        update_table(str(old), cols, {"Top-1": "2.00", **a.cells("Model")})
    rows = update_table(str(old), cols, {"Top-1": "2.00", **a.cells("Model", "new")})
    assert [(r["Model"], r["Top-1"], r[WEIGHTS_COLUMN]) for r in rows] == [
        ("run", "90.48", ""),
        ("other", "1.00", ""),
        ("new", "2.00", "aaaa0000"),
    ]


def test_a_figure_of_other_data_is_never_replaced(tmp_path):
    """Proves: a row's figures are keyed by the data they were computed on (``sources``): the
    same model on another data root in a filled column is a RowClashError naming both sources
    and the hint, nothing written, check_row says so up front; figures of other data in other
    columns sit side by side; the same data updates; a cell whose data the table does not
    record is never taken for this run's; replace swaps the row; the Markdown twin leaves the
    sources out."""
    from transfer.tables import SOURCES_COLUMN, RowClashError, RowOwner, check_row

    path = tmp_path / "knn.csv"
    cols = ["Model", "imagefolder kNN top-1"]
    owner = RowOwner("run", "LORAC", "aaaa0000").cells("Model")
    a, b = {cols[1]: "imagefolder /data/a"}, {cols[1]: "imagefolder /data/b"}
    update_table(str(path), cols, {cols[1]: "80.00", **owner}, sources=a)
    before = (path.read_bytes(), (tmp_path / "knn.md").read_bytes())
    clash = (
        "knn.csv: row 'run' holds 'imagefolder kNN top-1' 80.00 computed on imagefolder "
        "/data/a, this run's is computed on imagefolder /data/b; use --name"
    )
    with pytest.raises(RowClashError, match=re.escape(clash)):
        check_row(str(path), "Model", owner, sources=b, hint="use --name")
    with pytest.raises(RowClashError, match=re.escape(clash)):
        update_table(str(path), cols, {cols[1]: "70.00", **owner}, sources=b, hint="use --name")
    assert (path.read_bytes(), (tmp_path / "knn.md").read_bytes()) == before

    fm = {"fashion-mnist kNN top-1": "fashion-mnist /data/fm"}
    update_table(str(path), cols, {"fashion-mnist kNN top-1": "90.00", **owner}, sources=fm)
    rows = update_table(str(path), cols, {cols[1]: "81.00", **owner}, sources=a)
    (row,) = rows
    assert (row[cols[1]], row["fashion-mnist kNN top-1"]) == ("81.00", "90.00")
    assert json.loads(row[SOURCES_COLUMN]) == a | fm
    assert read_csv(str(path)).columns[-1] == SOURCES_COLUMN
    assert SOURCES_COLUMN not in (tmp_path / "knn.md").read_text()

    rows = update_table(str(path), cols, {cols[1]: "70.00", **owner}, sources=b, replace=True)
    assert [(r[cols[1]], r["fashion-mnist kNN top-1"]) for r in rows] == [("70.00", "")]
    assert json.loads(rows[0][SOURCES_COLUMN]) == b

    old = tmp_path / "old.csv"
    old.write_text(f"Model,{cols[1]}\nrun,80.00\n")
    with pytest.raises(RowClashError, match="80.00 computed on data it does not record"):
        update_table(str(old), cols, {cols[1]: "70.00", "Model": "run"}, sources=b)
