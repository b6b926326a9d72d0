"""tools/make_report.py and transfer.analysis.report: one HTML + Markdown report.

The fixture builds a whole experiment on disk with the project's own writers: tiny pretraining
runs (checkpoint, config.yaml, metrics.json), the nuclear-norm analysis of those checkpoints,
classification tables written by transfer.tables.update_table, detection
results.json written by transfer.detection.results.write_results, and an ablation table.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from tests.helpers import make_image_folder
from tests.helpers.analysis import assert_png_not_blank, exit_status, make_run, write_metrics
from transfer.analysis import AnalysisError
from transfer.analysis.nuclear_norm_outputs import AnalysisOptions, analyze, write_outputs
from transfer.analysis.report import build_report
from transfer.classification.report import LINEAR_COLUMNS, SEMI_COLUMNS, transfer_columns
from transfer.classification.transfer_datasets import DATASET_NAMES
from transfer.cli.make_report import main as report_main
from transfer.detection.results import write_results
from transfer.tables import read_csv, update_table


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> dict[str, Path]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("exp")
    data = tmp / "data"
    make_image_folder(data / "train", classes=2, per_class=3, size=24)
    make_image_folder(data / "val", classes=2, per_class=2, size=24)
    lorac = make_run(tmp / "runs" / "lorac", data, seed=1, **{"LOSS.BETA": 2.0})
    mocom = make_run(tmp / "runs" / "mocom", data, seed=2, **{"LOSS.PRIOR": "none"})
    nuclear = tmp / "nuclear"
    opt = AnalysisOptions("imagefolder", str(data), max_images=3, knn_train=6, knn_k=3)
    write_outputs(analyze([str(lorac), str(mocom)], opt), str(nuclear), views=32)

    ev = tmp / "eval"
    linear = {"arch.": "resnet18", "pars. (M)": "11.2", "batchsize": 256, "epochs": 1}
    for name, top1 in (("LORAC", "45.10"), ("MoCo-M", "44.00"), ("lorac_demo", "40.00")):
        update_table(
            str(ev / "table1_linear.csv"),
            LINEAR_COLUMNS,
            {"Method": name, **linear, "Top-1": top1, "Top-5": "80.00"},
        )
    names = list(DATASET_NAMES.values())
    update_table(
        str(ev / "table2_transfer.csv"),
        transfer_columns(names),
        {"Model": "LORAC", "CIFAR10": "61.25", "DTD": "33.50", "Average": "47.38"},
    )
    update_table(
        str(ev / "semi" / "table3_semi.csv"),
        SEMI_COLUMNS,
        {"Model": "LORAC", "1% Top-1": "12.50", "1% Top-5": "30.00"},
    )
    update_table(
        str(ev / "knn.csv"),
        ["Model", "fashion-mnist kNN top-1", "k", "T"],
        {"Model": "LORAC", "fashion-mnist kNN top-1": "71.20", "k": 200, "T": 0.07},
    )
    (ev / "notes_extra.csv").write_text("what,value\nwall-clock hours,3.5\n")

    det = tmp / "coco"
    for label, mask, ap in (("lorac", False, 39.0), ("lorac", True, 36.5), ("", False, 30.0)):
        cfg = {
            "MODEL": {"WEIGHTS": f"pretrained/{label}.pkl" if label else "", "MASK_ON": mask},
            "SOLVER": {"MAX_ITER": 10},
        }
        task = "segm" if mask else "bbox"
        res = {"bbox": {"AP": ap, "AP50": ap + 20, "AP75": ap + 2}}
        if mask:
            res[task] = {"AP": ap, "AP50": ap + 21, "AP75": ap + 3}
        write_results(str(det / f"{label or 'random'}_{task}"), cfg, res, ["coco_2017_val"])
    (det / "unfinished").mkdir()  # a run still training: no results.json, not an error

    abl = tmp / "in100"
    for name, top1 in (("LORAC", "60.00"), ("Gauss.", "59.00"), ("MoCo-v2", "50.00")):
        update_table(
            str(abl / "table1_linear.csv"),
            LINEAR_COLUMNS,
            {"Method": name, **linear, "Top-1": top1, "Top-5": "85.00"},
        )
    return {
        "tmp": tmp,
        "lorac": lorac,
        "mocom": mocom,
        "nuclear": nuclear,
        "eval": ev,
        "det": det,
        "abl": abl,
    }


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.srcs += [v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#")]


def _table(report, number: int):
    return next(t for t in report.tables if t.title.startswith(f"Table {number} "))


def _rows(table, source: str) -> dict[str, list[str]]:
    return {r[0]: r[2:] for r, k in zip(table.rows, table.kinds, strict=True) if r[1] == source}


def test_report_has_every_figure_and_table(experiment):
    e = experiment
    out = e["tmp"] / "report"
    report = build_report(
        [str(e["lorac"]), f"MoCo-M={e['mocom']}"],
        str(out),
        eval_dirs=[str(e["eval"])],
        detection_dirs=[str(e["det"])],
        ablation_dirs=[str(e["abl"])],
        nuclear_dir=str(e["nuclear"]),
    )
    # 7 training metrics, 4 collapse diagnostics + histogram, nuclear norm vs beta, accuracy vs
    # nuclear norm (no feature picture: these runs have no labelled kNN root)
    titles = [f.title for f in report.figures]
    assert len(titles) == 14 and len(set(titles)) == 14, titles
    for fig in report.figures:
        assert_png_not_blank(fig.path)
        if fig.points is not None:  # curves: the plotted points are the CSV's rows
            assert fig.points == len(read_csv(str(Path(fig.path).with_suffix(".csv"))).rows)
    knn_curve = next(f for f in report.figures if "kNN" in f.title)
    assert knn_curve.points == 2 * 3  # two runs, kNN logged at iterations 3, 7, 11

    html = (out / "report.html").read_text()
    parser = _Images()
    parser.feed(html)
    assert not parser.tags & {"link", "script", "iframe", "object"}
    assert "http" not in html and "url(" not in html
    assert len(parser.srcs) == len(report.figures)  # one embedded image per figure
    embedded = [base64.b64decode(s.split(",", 1)[1]) for s in parser.srcs]
    assert all(s.startswith("data:image/png;base64,") for s in parser.srcs)
    for fig, data in zip(report.figures, embedded, strict=True):
        assert data == Path(fig.path).read_bytes(), fig.title
        assert_png_not_blank(io.BytesIO(data))
    for t in report.tables:
        assert t.title.replace("&", "&amp;") in html, t.title

    md = (out / "report.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert len(links) == len(report.figures)
    for link in links:
        assert (out / link).is_file(), link
    for number in range(1, 6):
        assert f"### Table {number} (" in md


def test_paper_tables_hold_this_runs_rows_beside_the_papers(experiment):
    e = experiment
    report = build_report(
        [str(e["lorac"])],
        str(e["tmp"] / "r2"),
        eval_dirs=[str(e["eval"])],
        detection_dirs=[str(e["det"])],
        ablation_dirs=[str(e["abl"])],
    )
    t1 = _table(report, 1)
    assert _rows(t1, "paper")["LORAC"][-2:] == ["73.2", "91.6"]
    ours = _rows(t1, "this run")
    assert ours["LORAC"][-2:] == ["45.10", "80.00"] and ours["LORAC"][1] == "1"  # epochs alias
    assert ours["lorac_demo"][-2] == "40.00"  # no paper row: listed after the paper's rows
    assert ours["MoCo-v2"][0] == "not run"  # a main method without a result
    names = [r[0] for r in t1.rows]
    assert names.index("LORAC") < names.index("lorac_demo")
    t2 = _rows(_table(report, 2), "this run")["LORAC"]
    columns = _table(report, 2).columns[2:]
    assert t2[columns.index("CIFAR10")] == "61.25" and t2[columns.index("Food")] == ""
    assert _rows(_table(report, 3), "this run")["LORAC"][:2] == ["12.50", "30.00"]
    t4 = _rows(_table(report, 4), "this run")
    assert t4["lorac"][:6] == ["39.000", "59.000", "41.000", "36.500", "57.500", "39.500"]
    assert t4["random"][0] == "30.000"
    t5 = _rows(_table(report, 5), "this run")
    assert t5["Gauss."] == ["59.00", "85.00"] and t5["MoCo-M"][0] == "not run"
    assert _rows(_table(report, 5), "paper")["L-sftmx-c"] == ["76.8", "94.2"]
    html = Path(report.html_path).read_text()
    assert "Not logged" not in html  # the fake runs log every metric
    assert "notes_extra.csv" in html and "wall-clock hours" in html  # unknown CSVs are shown
    assert "not run: no --nuclear-dir given" in html


def test_missing_pieces_say_not_run(tmp_path):
    empty = tmp_path / "never_started"
    empty.mkdir()
    report = build_report([str(empty)], str(tmp_path / "out"))
    html = Path(report.html_path).read_text()
    assert "no metrics.json" in html and "no config.yaml" in html
    assert "not run: no result file for this table was found." in html
    assert "not run: no knn.csv" in html
    assert report.figures == []


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("table1_linear.csv", "Method,Top-1,Top-5\nLORAC,45.1\n", r"line 2 has 2 fields"),
        ("table1_linear.csv", "Method,Top-1,Top-5\nLORAC,abc,80\n", r"row 1, column 'Top-1'"),
        ("table2_transfer.csv", "Name,CIFAR10\nLORAC,50\n", r"expected a 'Model' column"),
        ("other.csv", "", r"empty CSV file"),
    ],
)
def test_malformed_result_files_are_errors_naming_them(tmp_path, name, content, message):
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / name).write_text(content)
    with pytest.raises(AnalysisError, match=re.escape(str(ev / name)) + ".*" + message):
        build_report([], str(tmp_path / "out"), eval_dirs=[str(ev)])


def test_malformed_metrics_and_results_json(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_metrics(run / "metrics.json", beta=2.0)
    with open(run / "metrics.json", "a") as f:
        f.write('{"iteration": 12, "total_loss": 1.0\n')
    rc = exit_status(report_main, [str(run), "--out", str(tmp_path / "out")])
    assert rc == 2
    assert f"{run / 'metrics.json'}: line 13 is not JSON" in capsys.readouterr().err
    det = tmp_path / "coco" / "a"
    det.mkdir(parents=True)
    (det / "results.json").write_text("{not json")
    with pytest.raises(AnalysisError, match=re.escape(str(det / "results.json"))):
        build_report([], str(tmp_path / "out"), detection_dirs=[str(tmp_path / "coco")])
    with pytest.raises(AnalysisError, match="nowhere: results folder not found"):
        build_report([], str(tmp_path / "out"), eval_dirs=[str(tmp_path / "nowhere")])


def test_cli_writes_both_files(experiment, tmp_path, capsys):
    e = experiment
    rc = report_main(
        [
            str(e["lorac"]),
            str(e["mocom"]),
            "--out",
            str(tmp_path),
            "--eval-dir",
            str(e["eval"]),
            "--nuclear-dir",
            str(e["nuclear"]),
        ]
    )
    assert rc == 0
    assert "14 figures" in capsys.readouterr().out
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.md").is_file()
    assert exit_status(report_main, ["--out", str(tmp_path)]) == 2


def test_a_run_whose_prior_never_turned_on_is_labelled_so_in_the_analysis_and_report(
    tmp_path, monkeypatch
):
    """A LORAC run (LOSS.BETA 2) that logged beta = inf throughout (its prior never turned on)
    is shown as such, not as beta 2: in the nuclear-norm CSVs and at beta = inf in Fig. 3b, in
    the report's table of runs, and in the report's study section (records whose prior never
    turned on)."""
    import json

    from tests.helpers.analysis import study_record
    from transfer.analysis import plots
    from transfer.cli.make_report import main as make_report_main

    torch.set_num_threads(1)
    data = tmp_path / "data"
    make_image_folder(data / "train", classes=2, per_class=2, size=24)
    make_image_folder(data / "val", classes=2, per_class=1, size=24)
    quick = make_run(tmp_path / "quick", data, seed=1, **{"LOSS.BETA": 2.0})
    write_metrics(quick / "metrics.json", beta=math.inf)  # beta = inf at every iteration
    on = make_run(tmp_path / "on", data, seed=2, **{"LOSS.BETA": 2.0})  # inf, then 2
    drawn = []
    plot = plots.plot_vs_beta
    monkeypatch.setattr(
        plots, "plot_vs_beta", lambda p, *a, **k: drawn.extend(p) or plot(p, *a, **k)
    )
    opt = AnalysisOptions("imagefolder", str(data), max_images=2)
    written = write_outputs(analyze([str(quick), str(on)], opt), str(tmp_path / "nuc"), views=8)
    never = "inf (prior never on; LOSS.BETA 2)"
    assert [r["beta"] for r in read_csv(written["beta"].csv).rows] == [never, "2"]
    assert {r["beta"] for r in read_csv(written["hist"].csv).rows} == {never, "2"}
    assert [(p.label, p.beta) for p in drawn] == [("quick (prior never on)", math.inf), ("on", 2)]

    records = tmp_path / "records"
    records.mkdir()
    for method, label, prior_on in (("lorac", "LORAC", 64), ("mocom", "MoCo-M", None)):
        for seed in (0, 1):
            r = study_record(method, label, seed, 80.0 + seed, 6.0, prior_on_iter=prior_on)
            (records / f"{method}_seed{seed}.json").write_text(json.dumps(r))
    # the report's study section comes from the study (tools/make_report.py --study-records)
    argv = [str(quick), str(on), "--out", str(tmp_path / "out"), "--study-records", str(records)]
    assert make_report_main(argv) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"| quick | laplace | {never} |" in md and "| on | laplace | 2.00 |" in md
    assert "| LORAC (prior never on: β = ∞ throughout) | 2 |" in md
    assert "LORAC and MoCo-M trained the same objective" in md


def test_the_report_shows_each_runs_feature_picture_and_collapse_numbers(tmp_path):
    """A finished Fashion-MNIST run (the demo's dataset): its t-SNE picture beside random init
    is written into the run directory and shown in report.html and report.md; the collapse
    diagnostics of its last kNN evaluation are a table."""
    from tests.helpers.analysis import make_fashion_mnist

    fm = make_fashion_mnist(tmp_path / "fm", n_train=20, n_test=12)
    run = make_run(tmp_path / "demo", fm, seed=0, **{"DATASETS.TYPE": "fashion_mnist"})
    last = {"iteration": 12, "knn/top1": 0.5, "knn/effective_rank": 1.5, "knn/std": 0.01,
            "knn/std_ratio": 0.2, "knn/alignment": 0.3, "knn/uniformity": -1.2}  # fmt: skip
    with (run / "metrics.json").open("a") as f:  # a collapsed last evaluation
        f.write(json.dumps(last) + "\n")
    report = build_report([str(run)], str(tmp_path / "out"), embedding_images=12)
    png = run / "embedding_tsne.png"
    assert png.stat().st_size > 0
    assert_png_not_blank(png)
    [fig] = [f for f in report.figures if "random init" in f.title]
    assert fig.points == 2 * 12  # both panels, every image
    html = (tmp_path / "out" / "report.html").read_text()
    assert base64.b64encode(Path(fig.path).read_bytes()).decode() in html
    assert "figures/embedding_demo.png" in (tmp_path / "out" / "report.md").read_text()
    [table] = [t for t in report.tables if t.title == "At the last kNN evaluation of each run"]
    assert table.rows == [["demo", "12", "50.00", "1.5", "0.01", "0.2", "0.3", "-1.2", "yes"]]
