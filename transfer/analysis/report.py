"""One report of an experiment: ``report.html`` (self-contained, :mod:`.report_html`) and
``report.md`` with its PNGs in ``OUT/figures/``. Sections: the pretraining runs and their curves,
the paper's Tables 1-5 with this run's rows beside the paper's, kNN, the nuclear-norm figures,
the studies and any other result CSV. A missing piece is "not run"; a malformed file stops the
report with an :class:`~transfer.analysis.AnalysisError` naming it.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pretrain.evaluation.collapse import MIN_EFFECTIVE_RANK, MIN_STD_RATIO
from transfer.analysis import AnalysisError, plots
from transfer.analysis.embedding import draw_embedding
from transfer.analysis.nuclear_norm_outputs import FIGURES as NUCLEAR_FIGURES
from transfer.analysis.paper_tables import PAPER_TABLES
from transfer.analysis.report_html import render_html
from transfer.analysis.report_sections import Figure, Section
from transfer.analysis.report_tables import Table, compare_table, csv_table, runs_table
from transfer.analysis.results import collect_results
from transfer.analysis.runs import CURVES, RunData, load_run
from transfer.tables import markdown_table, read_csv, write_csv

__all__ = ["Figure", "Report", "build_report"]


@dataclass
class Report:
    html_path: str
    markdown_path: str
    sections: list[Section]

    @property
    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures]

    @property
    def tables(self) -> list[Table]:
        return [t for s in self.sections for t in s.tables]


def _curves(runs: Sequence[RunData], fig_dir: str) -> Section:
    sec = Section("Training curves")
    missing, gaps = [], False
    for c in CURVES:
        series = {}
        for r in runs:
            xs, ys = r.series(c.key)
            gaps |= c.zero_is_missing and 0.0 in ys
            ys = [math.nan if c.zero_is_missing and y == 0.0 else y * c.scale for y in ys]
            if not all(math.isnan(y) for y in ys):
                series[r.label] = (xs, ys)
        if not series:
            missing.append(c.key)
            continue
        stem = os.path.join(fig_dir, "curve_" + re.sub(r"[^A-Za-z0-9]+", "_", c.key))
        drawn = plots.plot_curves(series, stem + ".png", ylabel=c.ylabel, title=c.title)
        rows = [
            {"run": k, "iteration": f"{x:g}", c.key: f"{y:.6g}"}
            for k, (xs, ys) in series.items()
            for x, y in zip(xs, ys, strict=True)
            if not math.isnan(y)
        ]
        write_csv(stem + ".csv", ["run", "iteration", c.key], rows)
        sec.figures.append(
            Figure(c.title, stem + ".png", f"metrics.json key {c.key!r}", sum(drawn.values()))
        )
    if gaps:
        sec.text.append(
            "some runs logged mean ||Q||_* as 0 (older runs did not compute it while the prior "
            "was off); those iterations are gaps in its curve."
        )
    if missing:
        sec.text.append("Not logged by any run: " + ", ".join(missing) + ".")
    return sec


def _collapse(runs: Sequence[RunData]) -> Section:
    """The collapse diagnostics of each run's last kNN evaluation (pretrain/evaluation/
    collapse.py)."""
    sec = Section("Collapse diagnostics (the kNN monitor's features)")
    keys = ("knn/top1", "knn/effective_rank", "knn/std", "knn/std_ratio", "knn/alignment",
            "knn/uniformity")  # fmt: skip
    table = Table(
        "At the last kNN evaluation of each run",
        [
            "run",
            "iteration",
            "kNN top-1 (%)",
            "effective rank",
            "std",
            "std x sqrt(d)",
            "alignment",
            "uniformity",
            "collapsed",
        ],  # fmt: skip
    )
    for r in runs:
        xs, _ = r.series("knn/effective_rank")
        if not xs:
            continue
        v = {k: r.last(k) for k in keys}
        bad = v["knn/effective_rank"] < MIN_EFFECTIVE_RANK or v["knn/std_ratio"] < MIN_STD_RATIO
        cells = [f"{100 * v['knn/top1']:.2f}" if v["knn/top1"] is not None else "-"]
        cells += [f"{v[k]:.4g}" if v[k] is not None else "-" for k in keys[1:]]
        table.add([r.label, f"{xs[-1]:g}", *cells, "yes" if bad else "no"])
    if table.rows:
        table.notes.append(
            f"collapsed: effective rank under {MIN_EFFECTIVE_RANK:g} or std x sqrt(d) under "
            f'{MIN_STD_RATIO:g} (docs/pretraining.md, "Collapse diagnostics"); alignment is '
            "over pairs of one class, uniformity over all pairs (Wang & Isola 2020)."
        )
        sec.tables.append(table)
    else:
        sec.text.append("not logged: no run's metrics.json has knn/effective_rank.")
    return sec


def _embeddings(runs: Sequence[RunData], fig_dir: str, images: int) -> Section:
    """The t-SNE picture of each run with a checkpoint (transfer/analysis/embedding.py), written
    into the run directory and copied here; a run that cannot be drawn says why."""
    sec = Section("Features: t-SNE of the kNN features, coloured by class")
    if images <= 0:
        sec.text.append("not drawn: --embedding-images 0.")
        return sec
    for r in runs:
        try:
            pic = draw_embedding(r.directory, images=images)
        except AnalysisError as e:
            sec.text.append(f"{r.label}: not drawn ({e}).")
            continue
        dst = os.path.join(fig_dir, f"embedding_{re.sub(r'[^A-Za-z0-9]+', '_', r.label)}.png")
        shutil.copyfile(pic.path, dst)
        caption = f"{pic.images} test images of {pic.classes} classes; {pic.path}"
        sec.figures.append(Figure(f"{r.label} beside random init", dst, caption, pic.points))
    return sec


def _nuclear(nuclear_dir: str, fig_dir: str) -> Section:
    sec = Section("Nuclear norm of augmented test views (paper Fig. 3b, 3c, 4c)")
    if not nuclear_dir:
        sec.text.append("not run: no --nuclear-dir given (tools/analyze_nuclear_norm.py).")
        return sec
    if not os.path.isdir(nuclear_dir):
        raise AnalysisError(f"{nuclear_dir}: nuclear-norm folder not found")
    titles = {
        "hist": "Histogram of ||Q_hat||_* (Fig. 4c)",
        "beta": "Mean ||Q_hat||_* vs beta (Fig. 3b)",
        "accuracy": "Accuracy vs ||Q_hat||_* (Fig. 3c)",
    }
    for key, stem in NUCLEAR_FIGURES.items():
        src = os.path.join(nuclear_dir, stem)
        if not os.path.isfile(src + ".png"):
            sec.text.append(f"{titles[key]}: not run ({stem}.png not in {nuclear_dir}).")
            continue
        csv = read_csv(src + ".csv") if os.path.isfile(src + ".csv") else None
        for ext in ("png", "csv"):
            if os.path.isfile(f"{src}.{ext}"):
                shutil.copyfile(f"{src}.{ext}", os.path.join(fig_dir, f"{stem}.{ext}"))
        sec.figures.append(Figure(titles[key], os.path.join(fig_dir, stem + ".png"), src + ".png"))
        if csv is not None and key != "hist":  # the histogram's CSV has one row per image
            sec.tables.append(csv_table(csv, titles[key] + ": data"))
    if not sec.figures:
        raise AnalysisError(f"{nuclear_dir}: none of {list(NUCLEAR_FIGURES.values())} (.png) in it")
    return sec


def build_report(
    run_specs: Sequence[str],
    out_dir: str,
    *,
    eval_dirs: Sequence[str] = (),
    detection_dirs: Sequence[str] = (),
    ablation_dirs: Sequence[str] = (),
    nuclear_dir: str = "",
    study_records: Sequence[str] = (),
    study_sections: Callable[[str], list[Section]] | None = None,
    title: str = "LORAC experiment report",
    embedding_images: int = 300,
) -> Report:
    """Read everything first (so a bad file fails before anything is written), then write.
    ``study_sections``: the sections of the study records ``study_records`` (read by the caller,
    :func:`transfer.study.page.report_sections`), given the figures folder to draw into."""
    runs = [load_run(s) for s in run_specs]
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise AnalysisError(f"two runs share a label in {labels}; use LABEL=RUN_DIR")
    results = collect_results(eval_dirs, detection_dirs, ablation_dirs)
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)

    overview = Section("Pretraining runs", tables=[runs_table(runs)])
    if not runs:
        overview.text.append("not run: no pretraining run directories given.")
    sections = [overview, _curves(runs, fig_dir), _collapse(runs)]
    if runs:
        sections.append(_embeddings(runs, fig_dir, embedding_images))
    tables = Section("The paper's tables with this run's numbers")
    tables.text.append(
        "Rows 'paper' are transcribed from the paper's LaTeX; rows 'this run' come "
        "from the evaluation tools' CSV files (matched by model name)."
    )
    for key, paper in PAPER_TABLES.items():
        tables.tables.append(
            compare_table(paper, results.rows.get(key, []), results.sources.get(key, []))
        )
    sections.append(tables)
    knn = [t for t in results.other if os.path.basename(t.path) == "knn.csv"]
    sec = Section("kNN accuracy (not in the paper)", tables=[csv_table(t, "kNN") for t in knn])
    if not knn:
        sec.text.append("not run: no knn.csv (tools/knn_eval.py) found.")
    sections.append(sec)
    sections.append(_nuclear(nuclear_dir, fig_dir))
    sections += study_sections(fig_dir) if study_sections else []
    other = [t for t in results.other if os.path.basename(t.path) != "knn.csv"]
    if other:
        sections.append(
            Section(
                "Other result tables",
                tables=[csv_table(t, os.path.basename(t.path)) for t in other],
            )
        )
    inputs = [
        f"runs: {', '.join(run_specs) or 'none'}",
        f"evaluation folders: {', '.join(eval_dirs) or 'none'}",
        f"detection folders: {', '.join(detection_dirs) or 'none'}",
        f"ablation folders (Table 5): {', '.join(ablation_dirs) or 'none'}",
        f"nuclear-norm folder: {nuclear_dir or 'none'}",
        f"study records: {', '.join(study_records) or 'none'}",
    ]
    md_path = os.path.join(out_dir, "report.md")
    html_path = os.path.join(out_dir, "report.html")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(render_markdown(title, stamp, inputs, sections, out_dir))
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(render_html(title, stamp, inputs, sections))
    return Report(html_path, md_path, sections)


def _md(text: str) -> str:
    """Escape Markdown's emphasis, code, link and table characters (``||Q||_*`` is common)."""
    return re.sub(r"([\\`*_\[\]|<>])", r"\\\1", text).replace("\n", " ")


def _md_cell(text: str, bold: bool = False) -> str:
    if not text:
        return " "
    return f"**{_md(text)}**" if bold else _md(text)


def render_markdown(
    title: str, stamp: str, inputs: list[str], sections: list[Section], out_dir: str
) -> str:
    lines = [f"# {_md(title)}", "", f"Generated {stamp}.", ""]
    lines += [f"- {_md(i)}" for i in inputs] + [""]
    for sec in sections:
        lines += [f"## {_md(sec.title)}", ""]
        lines += [_md(p) + "\n" for p in sec.text]
        for fig in sec.figures:
            rel = os.path.relpath(fig.path, out_dir).replace(os.sep, "/")
            lines += [
                f"![{_md(fig.title)}]({rel})",
                "",
                f"{_md(fig.title)} ({_md(fig.caption)})",
                "",
            ]
        for t in sec.tables:
            rows = [
                [_md_cell(c, kind == "ours") for c in cells]
                for cells, kind in zip(t.rows, t.kinds, strict=True)
            ]
            lines += [f"### {_md(t.title)}", ""]
            lines += markdown_table([_md_cell(c) for c in t.columns], rows).splitlines()
            lines += [""] + [_md(n) + "\n" for n in t.notes]
    return "\n".join(lines) + "\n"
