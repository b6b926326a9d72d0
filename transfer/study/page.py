"""A study's Markdown page (``docs/results.md``, ``results_beta.md``, ``results_views.md``): a
list of sections, each a short function returning its paragraphs, and the same study as sections of
the HTML report (:func:`report_sections`, ``tools/make_report.py --study-records``). The page is a
function of the records, the options and the :class:`Invocation` that writes it alone, so
rewritten from the committed records it comes out byte for byte; :func:`write_report` logs the
invocation, draws the plots and writes it.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pretrain.evaluation.knn import KNN_K, KNN_T
from pretrain.utils.atomic_io import atomic_write_bytes
from transfer.analysis.report_sections import Figure, Section
from transfer.analysis.report_tables import Table
from transfer.tables import markdown_table

from .comparison import Comparison, comparison, mean_table
from .experiments import Experiment, Method, StudyOptions
from .figures import write_plots
from .records import INVOCATIONS, cpu_cores, log_invocation, threads_per_run
from .stats import MethodSummary, mean_std, never_on_label, prior_never_on, summarize

__all__ = [
    "TARGETS",
    "Invocation",
    "missing_section",
    "prior_never_on_section",
    "probe_page",
    "render_page",
    "report_sections",
    "seed_table",
    "write_report",
]

TARGETS = {"": "make study", "beta": "make study-beta", "views": "make study-views"}


@dataclass(frozen=True)
class Invocation:
    """What the page states about the invocation of the study that writes it."""

    stamp: str  # when the page is written, ISO 8601 to the second
    seconds: float  # this invocation's wall time
    runs_done: int | None  # runs it trained or evaluated; 0: it only rewrote the page
    logged: Sequence[Mapping] = ()  # every invocation that ran something (INVOCATIONS)
    machine: Mapping[str, str] = field(default_factory=dict)  # hardware: name -> value
    threads_per_run: int = 1  # torch threads of each run (--jobs runs at once)


def render_page(
    opt: StudyOptions,
    results: Sequence[Mapping],
    png: str,
    invocation: Invocation,
    missing: Sequence[str] = (),
) -> str:
    """The Markdown page of ``results`` with its plot ``png``; ``missing``: one line per run
    without a result, said under the title so that no mean passes for one over every seed."""
    summaries = summarize(results, opt.methods)
    found, seeds = comparison(opt, summaries), seed_table(opt, results)
    blocks = [  # each a list of paragraphs
        _head(opt, results, found.title, invocation.stamp),
        missing_section(missing),
        prior_never_on_section(opt, results),
        _findings(opt, found),
        _means(opt, summaries, png),
        [] if opt.sweep else _paired(found.table),
        [f"## {seeds.title}", _markdown(seeds)],
        _command(opt),
        _budget(opt, results, summaries),
        _hardware(opt, results, invocation),
    ]
    return "\n\n".join(paragraph for block in blocks for paragraph in block) + "\n"


def missing_section(missing: Sequence[str]) -> list[str]:
    """The runs without a result, one per line ([] when every run is done)."""
    if not missing:
        return []
    return [
        f"## Missing runs ({len(missing)})",
        "These cells have no result: every mean, interval and plot below is over the seeds "
        "that are done (the seed tables list them).",
        "\n".join(f"- {line}" for line in missing),
    ]


def prior_never_on_section(opt: StudyOptions, results: Sequence[Mapping]) -> list[str]:
    """The runs whose prior never turned on (:func:`.stats.prior_never_on`), whose
    numbers say nothing about the prior; [] when there are none."""
    late: dict[str, list[Mapping]] = {}
    for r in _in_order(opt, results):
        if prior_never_on(r):
            late.setdefault(r["label"], []).append(r)
    if not late:
        return []
    lines = []
    for label, runs in late.items():
        seeds = ", ".join(str(r["seed"]) for r in runs)
        ends = sorted({r["max_iter"] for r in runs})
        ons = sorted({r["prior_on_iter"] for r in runs})
        why = (
            "its LOSS.BETA is ∞, which turns the prior off"
            if math.isinf(runs[0].get("beta", 0.0))
            else f"the prior would have turned on at iteration {', '.join(map(str, ons))}"
        )
        lines.append(
            f"- {label} (seed{'s' if len(runs) > 1 else ''} {seeds}): training ended at "
            f"iteration {', '.join(map(str, ends))}; {why}."
        )
    return [
        "## The prior never turned on",
        "Training ended before the prior turns on (`LOSS.BETA_INF_EPOCHS`) in these runs: they "
        "trained with β = ∞ throughout, MoCo-M's objective, so they are MoCo-M in all but name "
        "and their numbers say nothing about the prior. A longer budget (`SOLVER.MAX_ITER`, "
        "`SOLVER.EPOCHS`) or a shorter `LOSS.BETA_INF_EPOCHS` turns it on.",
        "\n".join(lines),
    ]


def _in_order(opt: StudyOptions, results: Sequence[Mapping]) -> list[Mapping]:
    return sorted(results, key=lambda r: (opt.methods.index(r["method"]), r["seed"]))


def _markdown(table: Table) -> str:
    """The table: the first column left-aligned, the others right, empty cells "-"."""
    aligns = ["left"] + ["right"] * (len(table.columns) - 1)
    return markdown_table(table.columns, table.rows, align=aligns, missing="-").rstrip("\n")


def _head(opt: StudyOptions, results: Sequence[Mapping], title: str, stamp: str) -> list[str]:
    seeds = " ".join(str(s) for s in opt.seeds)
    return [
        f"# {title}",
        f"Generated {stamp} by `tools/study.py` (`{TARGETS[opt.sweep]}`) from {len(results)} runs "
        f"(seeds {seeds}).",
    ]


def _findings(opt: StudyOptions, found: Comparison) -> list[str]:
    """The sentences; a sweep's table sits between the paper's shapes and what is seen here."""
    if not opt.sweep:
        return found.text
    return [f"## {found.table.title}", found.text[0], _markdown(found.table), *found.text[1:]]


def _means(opt: StudyOptions, summaries: Sequence[MethodSummary], png: str) -> list[str]:
    table = mean_table(summaries)
    return [
        f"## {table.title} (ddof = 1)",
        _markdown(table),
        f"![per-seed values and mean ± std]({os.path.basename(png)})",
        "‖Q̂‖∗: nuclear norm of the L2-normalised query-encoder embeddings of "
        f"{opt.nuclear_views} augmented views of a test image (paper Fig. 4c), averaged over "
        f"{opt.nuclear_images} test images spread over the split; the same views for every model "
        f"(seed {opt.nuclear_seed}). Its minimum is √{opt.nuclear_views} = "
        f"{math.sqrt(opt.nuclear_views):.3f} (identical views).",
    ]


def _paired(table: Table) -> list[str]:
    """LORAC - MoCo-M per seed and its interval; nothing unless both ran."""
    if not table.rows:
        return []
    return [
        f"## {table.title}",
        _markdown(table),
        "The interval is Student's t over the per-seed differences (each seed gives both "
        "methods the same data order and initial weights); an interval that excludes 0 is a "
        "difference beyond the seed spread.",
    ]


def _or_dash(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def seed_table(opt: StudyOptions, results: Sequence[Mapping]) -> Table:
    """One row per run, in method then seed order: its numbers, times and speed."""
    rows = [
        {
            "Method": never_on_label(r["label"], prior_never_on(r)),
            "seed": r["seed"],
            "kNN top-1 (%)": f"{r['knn_top1']:.2f}",
            "linear top-1 (%)": f"{r['linear_top1']:.2f}",
            "‖Q̂‖∗ mean": f"{r['nuclear_mean']:.3f}",
            "‖Q̂‖∗ std over images": f"{r['nuclear_std']:.3f}",
            "pretraining (min)": _or_dash(r["train_seconds"], 1, 60.0)
            + (f" (resumed at it. {r['resumed_from_iter']})" if r["resumed_from_iter"] else ""),
            "images/s": _or_dash(r["images_per_sec"], 0),
            "evaluation (min)": _or_dash(r["eval_seconds"], 1, 60.0),
        }
        for r in _in_order(opt, results)
    ]
    return Table.of_rows("Per seed", list(rows[0]), rows)


def _config_line(method: Method) -> str:
    opts = f" with `{' '.join(str(o) for o in method.opts)}`" if method.opts else ""
    return f"- {method.label}: `{os.path.relpath(method.config)}`{opts}"


def _command(opt: StudyOptions) -> list[str]:
    overrides = f"`{' '.join(opt.opts)}`" if opt.opts else "none"
    return [
        "## Command",
        f"```\n{opt.command or TARGETS[opt.sweep]}\n```",
        f"Pretraining configs (overrides applied to every method: {overrides}):",
        "\n".join(_config_line(opt.method_table[m]) for m in opt.methods),
    ]


def _method_budget(s: MethodSummary, results: Sequence[Mapping]) -> str:
    runs = [r for r in results if r["method"] == s.key]
    r = runs[0]
    speeds = [x["images_per_sec"] for x in runs if x["images_per_sec"] is not None]
    speed = f", {np.mean(speeds):.0f} images/s" if speeds else ""
    epochs = r["max_iter"] * r["ims_per_batch"] / r["train_images"]
    return (
        f"- {s.label}: {r['max_iter']} iterations of {r['ims_per_batch']} images = "
        f"{epochs:.2f} epochs of {r['train_images']} training images (SOLVER.EPOCHS "
        f"{r['epochs']:g}), {r['views']} views per image{speed}."
    )


def _budget(
    opt: StudyOptions, results: Sequence[Mapping], summaries: Sequence[MethodSummary]
) -> list[str]:
    r = results[0]
    lines = [
        *(_method_budget(s, results) for s in summaries),
        f"- kNN: weighted k = {KNN_K}, T = {KNN_T} on pooled backbone features, {opt.knn_train} "
        f"reference (train) and {opt.knn_test} test images, at the pretraining crop size.",
        "- Linear probe on the same frozen features (the transfer harness's cached-feature "
        f"classifier, SGD, cosine, batch 256, {opt.probe_epochs} epochs): lr chosen among "
        f"{opt.probe_num_lrs} log-spaced values in {list(opt.probe_lr_range)} on "
        f"{opt.probe_heldout_per_class} held-out reference images per class (seeded by the run), "
        f"then retrained on all {r['probe_train_images']} references; top-1 on "
        f"{r['probe_test_images']} test images.",
        f"- Nuclear norm: {opt.nuclear_views} views x {opt.nuclear_images} test images.",
    ]
    return ["## Budget", "\n".join(lines)]


def _invocation_lines(invocations: Sequence[Mapping]) -> list[str]:
    if not invocations:
        return []
    total = sum(i["minutes"] for i in invocations)
    each = "; ".join(
        f"{i['finished'][:16].replace('T', ' ')}: {i['minutes']:.1f} min, {i['runs_done']} runs, "
        f"{i['jobs']} at once on {i['cpu_cores']} cores"
        for i in invocations
    )
    return [
        f"- Wall time of the target, summed over the invocations that ran something "
        f"(`{INVOCATIONS}` in the records): {total:.1f} min ({each})."
    ]


def _hardware(opt: StudyOptions, results: Sequence[Mapping], inv: Invocation) -> list[str]:
    # A run whose train_stats.json was lost has no pretraining time: counted as 0 (shown "-")
    per_run = [(r["train_seconds"] or 0.0) + r["eval_seconds"] for r in results]
    this = (
        "- This invocation of the study ran nothing: every run was recorded, and it rewrote "
        "this page from the records."
        if inv.runs_done == 0
        else f"- This invocation of the study: {inv.seconds / 60:.1f} min (runs already "
        "done are skipped, so a resumed study takes less)."
    )
    lines = [
        *(f"- {k}: {v}" for k, v in inv.machine.items()),
        f"- Wall time per run (pretraining + evaluation): mean {np.mean(per_run) / 60:.1f} min, "
        f"total {sum(per_run) / 60:.1f} min over {len(results)} runs.",
        *_invocation_lines(inv.logged),
        this,
        f"- Runs at once (`--jobs`): {opt.jobs}; with more than one, each run had "
        f"{inv.threads_per_run} torch thread(s) and shared the machine, so "
        "its wall time is longer than alone.",
    ]
    return ["## Hardware and wall time", "\n".join(lines)]


def hardware() -> dict[str, str]:
    import torch

    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
        )
    return {
        "CPU cores (nproc)": str(cpu_cores()),
        "CPU model": model,
        "torch": f"{torch.__version__} ({torch.get_num_threads()} threads)",
        "GPU": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none used",
    }


def write_report(
    opt: StudyOptions,
    results: Sequence[Mapping],
    wall_seconds: float,
    runs_done: int | None = None,
    missing: Sequence[str] = (),
) -> str:
    """Write ``opt.results`` (Markdown) and its plots beside it, logging the invocation in the
    records when it ran ``runs_done`` > 0 runs; ``missing``: the runs without a result."""
    invocation = Invocation(
        stamp=datetime.datetime.now().isoformat(timespec="seconds"),
        seconds=wall_seconds,
        runs_done=runs_done,
        logged=log_invocation(opt, wall_seconds, runs_done or 0),
        machine=hardware(),
        threads_per_run=threads_per_run(opt.jobs),
    )
    os.makedirs(os.path.dirname(os.path.abspath(opt.results)), exist_ok=True)
    summaries = summarize(results, opt.methods)
    png = write_plots(opt, summaries, os.path.splitext(opt.results)[0])[0][1]
    atomic_write_bytes(opt.results, render_page(opt, results, png, invocation, missing).encode())
    return png


def report_sections(loaded: Sequence[tuple], fig_dir: str) -> list[Section]:
    """One report section per ``(folder, options, results)`` of :func:`.records.load_records`:
    the sentences, tables and plots of its page, the plots drawn into ``fig_dir``."""
    sections = []
    for i, (d, opt, results) in enumerate(loaded):
        summaries = summarize(results, opt.methods)
        found = comparison(opt, summaries)
        sec = Section(f"{found.title} ({len(results)} runs: {d})", text=list(found.text))
        sec.tables += [t for t in (found.table, mean_table(summaries)) if t.rows]
        stem = os.path.join(fig_dir, f"study{i + 1}_{opt.sweep or 'methods'}")
        for title, path in write_plots(opt, summaries, stem):
            sec.figures.append(Figure(title, path, f"from {d}"))
        sections.append(sec)
    return sections


def probe_page(exp: Experiment, opt: StudyOptions, top1: Mapping, missing: Sequence[str]) -> str:
    """An ImageNet experiment's page: linear top-1 per method (``top1``: its (seed, value) of
    the runs that are done), mean ± sample std over those seeds, every seed's value, and the
    ``missing`` runs."""
    rows = []
    for m in opt.methods:
        done = top1.get(m, [])
        s = MethodSummary(m, "", [seed for seed, _ in done], {"linear_top1": [v for _, v in done]})
        mean = mean_std(s, "linear_top1") if done else "-"
        seeds = ", ".join(f"{seed}: {v:.2f}" for seed, v in done)
        rows.append([opt.method_table[m].label, f"{len(done)}/{len(opt.seeds)}", mean, seeds])
    table = markdown_table(["method", "seeds done", "linear top-1 (%)", "per seed"], rows)
    later = ["Later evaluations (their own tools):", *(f"- {t}" for t in exp.evaluation.later)]
    return "\n".join([
        f"# {exp.name}: paper {exp.paper}, linear top-1",
        "",
        f"Written by `{opt.command}`; mean ± sample standard deviation (ddof = 1) over seeds.",
        "",
        *"\n\n".join(missing_section(missing)).splitlines(),
        "",
        table,
        *(["", *later] if exp.evaluation.later else []),
        "",
    ])  # fmt: skip
