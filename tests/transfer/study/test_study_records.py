"""A study's committed records read back (transfer.study.records) and shown in the HTML
report (tools/make_report.py --study-records) with the same verdict as its Markdown page."""

from __future__ import annotations

import html
import json
import re

import pytest

from tests.helpers.analysis import assert_png_not_blank, exit_status, study_record
from transfer.cli.make_report import main as report_main
from transfer.study.comparison import comparison
from transfer.study.experiments import METHODS, StudyError, sweep_methods
from transfer.study.page import Invocation, render_page
from transfer.study.records import load_records
from transfer.study.stats import summarize

# Per-seed kNN: LORAC is 0.5 +- 0.1 above MoCo-M on every seed (beyond the spread).
KNN = {
    "lorac": [80.6, 81.0, 80.3, 80.9, 80.7],
    "mocom": [80.0, 80.6, 79.8, 80.4, 80.2],
    "mocov2": [78.0, 78.5, 78.1, 77.9, 78.3],
}


def _write_study(folder, methods=KNN):
    folder.mkdir(parents=True)
    for key, values in methods.items():
        for seed, knn in enumerate(values):
            r = study_record(key, METHODS[key].label, seed, knn, 6.0 + seed / 10)
            (folder / f"{key}_seed{seed}.json").write_text(json.dumps(r))
    return folder


def _write_views(folder):
    folder.mkdir(parents=True)
    for key, method in sweep_methods("views", 2.0).items():
        for seed in (0, 1, 2):
            knn = 75.0 + method.x + seed * 0.3 + (0.2 if key.startswith("lorac") else 0.0)
            r = study_record(key, method.label, seed, knn, 5.0)
            (folder / f"{key}_seed{seed}.json").write_text(json.dumps(r))
    (folder / "invocations.json").write_text('{"invocations": []}')  # not a run record
    return folder


def test_load_records_finds_the_study_and_its_sweep(tmp_path):
    opt, results = load_records(str(_write_study(tmp_path / "study")))
    assert (opt.sweep, opt.methods, opt.seeds) == (
        "",
        ("lorac", "mocom", "mocov2"),
        tuple(range(5)),
    )
    assert len(results) == 15
    opt, results = load_records(str(_write_views(tmp_path / "views")))
    assert opt.sweep == "views" and len(opt.methods) == 8 and len(results) == 24
    assert opt.method_table["lorac_M6"].x == 6


@pytest.mark.parametrize(
    "bad, message",
    [
        (None, "no study records"),
        ("not json", "not valid JSON"),
        ('{"method": "lorac"}', "not a study record, missing"),
        (json.dumps(study_record("mocom", "MoCo-M", 3, 80.0, 6.0)), "not what its name says"),
        (json.dumps(study_record("lorac_x", "?", 0, 80.0, 6.0)), "unknown methods ['lorac_x']"),
    ],
)
def test_bad_records_are_errors_naming_them(tmp_path, bad, message):
    folder = tmp_path / "records"
    folder.mkdir()
    name = "lorac_x_seed0.json" if "lorac_x" in (bad or "") else "lorac_seed0.json"
    if bad is not None:
        (folder / name).write_text(bad)
    with pytest.raises(StudyError, match=re.escape(message)) as e:
        load_records(str(folder))
    assert str(folder) in str(e.value)


def test_html_report_states_each_comparison_as_its_page(tmp_path, capsys):
    """The report's study sections carry the page's sentences (computed from the same records),
    the paired table and the plots; the paired interval here excludes 0, so the sentence says
    LORAC beats MoCo-M."""
    study = _write_study(tmp_path / "study")
    views = _write_views(tmp_path / "views")
    out = tmp_path / "report"
    rc = report_main(["--study-records", str(study), str(views), "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    page = html.unescape((out / "report.html").read_text())
    md = (out / "report.md").read_text()
    for folder in (study, views):
        opt, results = load_records(str(folder))
        summaries = summarize(results, opt.methods)
        found = comparison(opt, summaries)
        markdown_page = render_page(opt, results, "x.png", Invocation("now", 0.0, None))
        for sentence in found.text:
            assert sentence in markdown_page  # the page and the report say the same
            assert sentence in page
        assert found.title in page
    assert "kNN top-1 +0.50 points, 95 % CI [+0.41, +0.59] (LORAC beats MoCo-M" in page
    assert "LORAC is above MoCo-M beyond the seed spread at M = 2, 3, 4, 6" in page
    assert "LORAC − MoCo-M, paired by seed" in md and "The sweep" in md
    for name in ("study1_methods.png", "study2_views.png", "study2_views_curves.png"):
        assert_png_not_blank(out / "figures" / name)


def test_html_report_refuses_bad_records_before_writing(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "lorac_seed0.json").write_text("{")
    out = tmp_path / "report"
    assert exit_status(report_main, ["--study-records", str(folder), "--out", str(out)]) == 2
    assert not (out / "report.html").exists()
