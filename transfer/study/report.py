"""The study's report: mean +- sample std per method and metric, per-seed rows, budget, hardware,
wall time, a sentence on LORAC vs MoCo-M computed from the numbers, and a plot beside it."""

from __future__ import annotations

import datetime
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pretrain.evaluation.knn import KNN_K, KNN_T
from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.tables import markdown_table

from .config import StudyOptions
from .records import INVOCATIONS, cpu_cores, log_invocation, threads_per_run

__all__ = [
    "METRICS",
    "Comparison",
    "comparison",
    "mean_rows",
    "write_plots",
    "MethodSummary",
    "PairedDifference",
    "hardware",
    "paired_difference",
    "paired_verdict",
    "summarize",
    "verdict",
    "write_report",
]

# study.json key -> (column title, digits)
METRICS = {
    "knn_top1": ("kNN top-1 (%)", 2),
    "linear_top1": ("linear top-1 (%)", 2),
    "nuclear_mean": ("test ‖Q̂‖∗", 3),
}


@dataclass
class MethodSummary:
    key: str
    label: str
    seeds: list[int]
    values: dict[str, list[float]]  # metric -> per-seed values, in seed order

    def mean(self, metric: str) -> float:
        return float(np.mean(self.values[metric]))

    def std(self, metric: str) -> float:
        """Sample standard deviation (ddof = 1); NaN for a single seed."""
        v = self.values[metric]
        return float(np.std(v, ddof=1)) if len(v) > 1 else math.nan


def summarize(results: Sequence[Mapping], methods: Sequence[str]) -> list[MethodSummary]:
    out = []
    for m in methods:
        rows = sorted((r for r in results if r["method"] == m), key=lambda r: r["seed"])
        if rows:
            values = {k: [float(r[k]) for r in rows] for k in METRICS}
            out.append(MethodSummary(m, rows[0]["label"], [r["seed"] for r in rows], values))
    return out


def _mean_std(s: MethodSummary, metric: str) -> str:
    digits = METRICS[metric][1]
    std = s.std(metric)
    std_text = "n/a" if math.isnan(std) else f"{std:.{digits}f}"
    return f"{s.mean(metric):.{digits}f} ± {std_text}"


def mean_rows(summaries: Sequence[MethodSummary]) -> list[dict]:
    """One row per method: its label, seeds and every metric's mean ± sample std."""
    return [
        {
            "Method": s.label,
            "seeds": len(s.seeds),
            **{METRICS[k][0]: _mean_std(s, k) for k in METRICS},
        }
        for s in summaries
    ]


def verdict(summaries: Sequence[MethodSummary]) -> str:
    """One sentence: does LORAC's kNN (and linear) mean beat MoCo-M's by more than the larger
    of their two seed standard deviations, or is the difference within the seed spread?"""
    by = {s.key: s for s in summaries}
    if "lorac" not in by or "mocom" not in by:
        return "LORAC and MoCo-M were not both run, so there is no LORAC vs MoCo-M comparison."
    lorac, mocom = by["lorac"], by["mocom"]
    if min(len(lorac.seeds), len(mocom.seeds)) < 2:
        return (
            "With a single seed per method there is no seed spread, so this study cannot say "
            "whether LORAC beats MoCo-M."
        )
    parts = []
    for metric, name in (("knn_top1", "kNN"), ("linear_top1", "linear-probe")):
        diff = lorac.mean(metric) - mocom.mean(metric)
        spread = max(lorac.std(metric), mocom.std(metric))
        if diff > spread:
            what = "LORAC beats MoCo-M"
        elif diff < -spread:
            what = "MoCo-M beats LORAC"
        else:
            what = "within the seed spread"
        parts.append(
            f"on {name} top-1 LORAC's mean is {abs(diff):.2f} points "
            f"{'above' if diff >= 0 else 'below'} MoCo-M's against a seed spread of "
            f"{spread:.2f} points ({what})"
        )
    return (
        f"Unpaired, {parts[0]}, and {parts[1]}, the seed spread being the larger of the two "
        f"methods' sample standard deviations over {len(lorac.seeds)} and {len(mocom.seeds)} "
        "seeds. Where the two disagree, the paired interval is the one this page goes by: it "
        "removes the variation that a seed gives both methods alike (the same data order and "
        "initial weights), which the unpaired comparison counts as spread."
    )


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` per common seed for one metric, its mean and 95 % t confidence interval."""

    metric: str
    seeds: list[int]
    diffs: list[float]
    mean: float
    low: float  # NaN with fewer than 2 seeds
    high: float

    @property
    def beyond_spread(self) -> int:
        """+1 when the interval lies above 0, -1 below, 0 when it includes 0 (or is undefined)."""
        if math.isnan(self.low):
            return 0
        return 1 if self.low > 0 else -1 if self.high < 0 else 0


def paired_difference(a: MethodSummary, b: MethodSummary, metric: str) -> PairedDifference:
    """The seed-paired difference ``a - b`` (the same seed gives both methods the same data
    order and initial weights): mean and Student-t 95 % interval over the common seeds."""
    from scipy import stats

    common = [s for s in a.seeds if s in b.seeds]
    va = dict(zip(a.seeds, a.values[metric], strict=True))
    vb = dict(zip(b.seeds, b.values[metric], strict=True))
    diffs = [va[s] - vb[s] for s in common]
    mean = float(np.mean(diffs)) if diffs else math.nan
    if len(diffs) < 2:
        return PairedDifference(metric, common, diffs, mean, math.nan, math.nan)
    half = float(stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / math.sqrt(len(diffs)))
    return PairedDifference(metric, common, diffs, mean, mean - half, mean + half)


def paired_verdict(summaries: Sequence[MethodSummary]) -> str:
    """One sentence per accuracy: does the paired 95 % interval of LORAC - MoCo-M exclude 0?"""
    by = {s.key: s for s in summaries}
    if "lorac" not in by or "mocom" not in by:
        return ""
    parts = []
    for metric, name in (("knn_top1", "kNN"), ("linear_top1", "linear-probe")):
        d = paired_difference(by["lorac"], by["mocom"], metric)
        if math.isnan(d.low):
            return "Fewer than two common seeds: no paired interval."
        what = {
            1: "LORAC beats MoCo-M beyond the seed spread",
            -1: "MoCo-M beats LORAC beyond the seed spread",
            0: "no difference beyond the seed spread at this scale",
        }[d.beyond_spread]
        parts.append(
            f"{name} top-1 {d.mean:+.2f} points, 95 % CI [{d.low:+.2f}, {d.high:+.2f}] ({what})"
        )
    n = len(paired_difference(by["lorac"], by["mocom"], "knn_top1").seeds)
    return f"Paired by seed ({n} seeds), LORAC - MoCo-M: {parts[0]}; {parts[1]}."


TARGETS = {"": "make study", "beta": "make study-beta", "views": "make study-views"}

PAPER_SHAPES = {
    "beta": (
        "The paper (Fig. 3, ImageNet-100, 100 epochs): accuracy is best at β = 2, falls towards "
        "MoCo-M's as β grows and collapses below β = 1 (3a); the test ‖Q̂‖∗ grows with β (3b); "
        "accuracy against ‖Q̂‖∗ is best at an intermediate norm (3c)."
    ),
    "views": (
        'The paper (Fig. 4b, ImageNet-100, M x 224 px views, β = 1; Sec. 6.2, "Impact of M"): '
        "LORAC improves as M grows and nearly plateaus beyond M = 6; it stays above MoCo-M at "
        'every M, with "a significant gap" (the text does not say whether the gap grows).'
    ),
}


def _spread_sentence(symbol: str, gaps: Sequence[tuple[float, PairedDifference]]) -> str:
    """Where the paired kNN interval of LORAC - MoCo-M excludes 0, in words."""
    above = [f"{x:g}" for x, d in gaps if d.beyond_spread == 1]
    below = [f"{x:g}" for x, d in gaps if d.beyond_spread == -1]
    if not above and not below:
        return (
            f"at no {symbol} does LORAC differ from MoCo-M in kNN beyond the seed spread (every "
            "paired 95 % CI includes 0)"
        )
    parts = []
    if above:
        parts.append(
            f"LORAC is above MoCo-M beyond the seed spread at {symbol} = {', '.join(above)}"
        )
    if below:
        parts.append(f"below it beyond the seed spread at {symbol} = {', '.join(below)}")
    rest = [f"{x:g}" for x, d in gaps if d.beyond_spread == 0]
    if rest:
        parts.append(f"within it at {symbol} = {', '.join(rest)}")
    return ", ".join(parts)


def _sweep_table(opt: StudyOptions, summaries: Sequence[MethodSummary]) -> tuple[list[dict], str]:
    """The sweep's table (per x: each method's means, LORAC - MoCo-M paired) and one sentence on
    what it shows next to the paper's curve shapes, computed from the numbers."""
    table = opt.method_table
    by = {s.key: s for s in summaries}
    rows: list[dict] = []
    if opt.sweep == "beta":
        mocom = by.get("mocom")
        found = []
        for key in opt.methods:
            if key not in by:
                continue
            s, x = by[key], table[key].x
            row = {"β": "∞ (MoCo-M)" if x == math.inf else f"{x:g}", "seeds": len(s.seeds)}
            row.update({METRICS[k][0]: _mean_std(s, k) for k in METRICS})
            if mocom is not None and key != "mocom":
                d = paired_difference(s, mocom, "knn_top1")
                row["kNN − MoCo-M [95 % CI]"] = f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"
                found.append((x, s.mean("knn_top1"), s.mean("nuclear_mean"), d))
            rows.append(row)
        if not found:
            return rows, ""
        best = max(found, key=lambda f: f[1])
        ordered = sorted(found, key=lambda f: f[0])
        nuc_up = all(a[2] <= b[2] for a, b in zip(ordered, ordered[1:], strict=False))
        low = ordered[0]
        collapse = (
            f"at β = {low[0]:g} kNN is below MoCo-M's beyond the seed spread, as the paper's "
            "collapse below β = 1"
            if low[3].beyond_spread == -1
            else f"no collapse at β = {low[0]:g} (the paper's collapse below β = 1 is not seen)"
        )
        return rows, (
            f"Here: kNN is highest at β = {best[0]:g} ({best[1]:.2f} %; the paper's peak is "
            f"at β = 2); the test ‖Q̂‖∗ "
            f"{'grows' if nuc_up else 'does not grow monotonically'} with β "
            f"({'as' if nuc_up else 'unlike'} the paper's Fig. 3b); {collapse}; "
            f"{_spread_sentence('β', [(f[0], f[3]) for f in ordered])}."
        )
    gaps = []
    for x in sorted({table[k].x for k in opt.methods}):
        lo, mo = by.get(f"lorac_M{x:g}"), by.get(f"mocom_M{x:g}")
        if lo is None or mo is None:
            continue
        d = paired_difference(lo, mo, "knn_top1")
        dl = paired_difference(lo, mo, "linear_top1")
        gaps.append((x, d))
        rows.append(
            {
                "M": f"{x:g}",
                "seeds": len(d.seeds),
                "LORAC kNN (%)": _mean_std(lo, "knn_top1"),
                "MoCo-M kNN (%)": _mean_std(mo, "knn_top1"),
                "kNN LORAC − MoCo-M [95 % CI]": f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                "linear LORAC − MoCo-M [95 % CI]": (
                    f"{dl.mean:+.2f} [{dl.low:+.2f}, {dl.high:+.2f}]"
                ),
            }
        )
    if not gaps:
        return rows, ""
    grows = gaps[-1][1].mean > gaps[0][1].mean
    return rows, (
        f"Here: {_spread_sentence('M', gaps)}; the mean kNN gap is "
        f"{gaps[0][1].mean:+.2f} at M = {gaps[0][0]:g} and "
        f"{gaps[-1][1].mean:+.2f} at M = {gaps[-1][0]:g} "
        f"({'growing' if grows else 'not growing'} with M)."
    )


def _paired_rows(summaries: Sequence[MethodSummary]) -> list[dict]:
    """LORAC - MoCo-M per common seed for every metric, then the mean [95 % CI]; [] unless both
    methods ran."""
    by = {x.key: x for x in summaries}
    if "lorac" not in by or "mocom" not in by:
        return []
    pairs = {k: paired_difference(by["lorac"], by["mocom"], k) for k in METRICS}
    rows: list[dict] = [
        {
            "seed": seed,
            **{METRICS[k][0]: f"{pairs[k].diffs[i]:+.{METRICS[k][1]}f}" for k in METRICS},
        }
        for i, seed in enumerate(pairs["knn_top1"].seeds)
    ]
    rows.append(
        {
            "seed": "mean [95 % CI]",
            **{
                METRICS[k][0]: f"{p.mean:+.{METRICS[k][1]}f} "
                f"[{p.low:+.{METRICS[k][1]}f}, {p.high:+.{METRICS[k][1]}f}]"
                for k, p in pairs.items()
            },
        }
    )
    return rows


TITLES = {
    "": "CPU-scale study: LORAC vs MoCo-M vs MoCo-v2 on Fashion-MNIST",
    "beta": "CPU-scale β sweep (paper Fig. 3): LORAC at five β and MoCo-M",
    "views": "CPU-scale M sweep (paper Fig. 4b): LORAC and MoCo-M at M views",
}


@dataclass
class Comparison:
    """What one study or sweep shows about LORAC vs MoCo-M: its title, the sentences (the
    paper's curve shapes first for a sweep) and its table (one dict of cells per row); the
    Markdown page and the HTML report (``tools/make_report.py --study-records``) both show it."""

    title: str
    text: list[str]
    rows: list[dict]


def paper_main_comparison() -> str:
    """The paper's own LORAC vs MoCo-M numbers (linear top-1, one run each), read from the
    transcribed tables so that they are written down once."""
    from transfer.analysis.paper_tables import PAPER_TABLES

    parts = []
    for key, where in (
        ("table1", "ImageNet-1K (ResNet-50, 200 epochs"),
        ("table5", "ImageNet-100 (ResNet-18, 100 epochs"),
    ):
        table = PAPER_TABLES[key]
        lo, mo = (table.row(n).values["Top-1"] for n in ("LORAC", "MoCo-M"))
        parts.append(f"{lo - mo:+.1f} points on {where}, Table {table.number}: {lo} vs {mo})")
    return (
        "The paper: LORAC − MoCo-M in linear top-1 is "
        + " and ".join(parts)
        + "; the paper reports no repeated runs or seed spread."
    )


def comparison(opt: StudyOptions, summaries: Sequence[MethodSummary]) -> Comparison:
    if opt.sweep:
        rows, sentence = _sweep_table(opt, summaries)
        text = [PAPER_SHAPES[opt.sweep], *([sentence] if sentence else [])]
    else:
        rows = _paired_rows(summaries)
        text = [
            t for t in (paired_verdict(summaries), verdict(summaries), paper_main_comparison()) if t
        ]
    return Comparison(TITLES[opt.sweep], text, rows)


def hardware() -> dict[str, str]:
    import torch

    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    cores = cpu_cores()
    return {
        "CPU cores (nproc)": str(cores),
        "CPU model": model,
        "torch": f"{torch.__version__} ({torch.get_num_threads()} threads)",
        "GPU": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none used",
    }


def _table(columns: Sequence[str], rows: Sequence[Mapping]) -> list[str]:
    """Table lines: the method left-aligned, numbers right, empty cells "-"."""
    aligns = ["left"] + ["right"] * (len(columns) - 1)
    return markdown_table(columns, rows, align=aligns, missing="-").splitlines()


def _fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def render(
    opt: StudyOptions,
    results: Sequence[Mapping],
    wall_seconds: float,
    png: str,
    invocations: Sequence[Mapping] = (),
    runs_done: int | None = None,
) -> str:
    """The Markdown page; ``runs_done`` 0: this invocation only rewrote it from the records."""
    summaries = summarize(results, opt.methods)
    seeds = " ".join(str(s) for s in opt.seeds)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    found = comparison(opt, summaries)
    lines = [
        f"# {found.title}",
        "",
        f"Generated {stamp} by `tools/study.py` (`{TARGETS[opt.sweep]}`) from {len(results)} runs "
        f"(seeds {seeds}).",
        "",
    ]
    if opt.sweep:
        lines += ["## The sweep", "", found.text[0], ""]
        lines += _table(list(found.rows[0]) if found.rows else ["x"], found.rows)
        lines += ["", *found.text[1:], ""]
    else:
        for sentence in found.text:
            lines += [sentence, ""]
    lines += ["## Mean ± sample standard deviation over seeds (ddof = 1)", ""]
    lines += _table(
        ["Method", "seeds", *(title for title, _ in METRICS.values())], mean_rows(summaries)
    )
    lines += [
        "",
        f"![per-seed values and mean ± std]({os.path.basename(png)})",
        "",
        "‖Q̂‖∗: nuclear norm of the L2-normalised query-encoder embeddings of "
        f"{opt.nuclear_views} augmented views of a test image (paper Fig. 4c), averaged over "
        f"{opt.nuclear_images} test images spread over the split; the same views for every model "
        f"(seed {opt.nuclear_seed}). Its minimum is √{opt.nuclear_views} = "
        f"{math.sqrt(opt.nuclear_views):.3f} (identical views).",
        "",
    ]
    if found.rows and not opt.sweep:
        lines += ["## LORAC − MoCo-M, paired by seed", ""]
        lines += _table(list(found.rows[0]), found.rows)
        lines += [
            "",
            "The interval is Student's t over the per-seed differences (each seed gives both "
            "methods the same data order and initial weights); an interval that excludes 0 is a "
            "difference beyond the seed spread.",
            "",
        ]
    lines += ["## Per seed", ""]
    cols = [
        "Method",
        "seed",
        "kNN top-1 (%)",
        "linear top-1 (%)",
        "‖Q̂‖∗ mean",
        "‖Q̂‖∗ std over images",
        "pretraining (min)",
        "images/s",
        "evaluation (min)",
    ]
    rows = []
    for r in sorted(results, key=lambda r: (opt.methods.index(r["method"]), r["seed"])):
        resumed = f" (resumed at it. {r['resumed_from_iter']})" if r["resumed_from_iter"] else ""
        rows.append(
            {
                "Method": r["label"],
                "seed": r["seed"],
                "kNN top-1 (%)": f"{r['knn_top1']:.2f}",
                "linear top-1 (%)": f"{r['linear_top1']:.2f}",
                "‖Q̂‖∗ mean": f"{r['nuclear_mean']:.3f}",
                "‖Q̂‖∗ std over images": f"{r['nuclear_std']:.3f}",
                "pretraining (min)": _fmt(r["train_seconds"], 1, 60.0) + resumed,
                "images/s": _fmt(r["images_per_sec"], 0),
                "evaluation (min)": _fmt(r["eval_seconds"], 1, 60.0),
            }
        )
    lines += _table(cols, rows)
    lines += ["", "## Command", "", "```", opt.command or TARGETS[opt.sweep], "```", ""]
    lines += ["Pretraining configs (overrides applied to every method: "]
    lines[-1] += f"`{' '.join(opt.opts)}`)" if opt.opts else "none)"
    lines[-1] += ":"
    lines += [""] + [
        f"- {opt.method_table[m].label}: `{os.path.relpath(opt.method_table[m].config)}`"
        + (
            f" with `{' '.join(str(o) for o in opt.method_table[m].opts)}`"
            if opt.method_table[m].opts
            else ""
        )
        for m in opt.methods
    ]
    lines += ["", "## Budget", ""]
    for s in summaries:
        r = next(r for r in results if r["method"] == s.key)
        speeds = [x["images_per_sec"] for x in results if x["method"] == s.key]
        speeds = [v for v in speeds if v is not None]
        speed = f", {np.mean(speeds):.0f} images/s" if speeds else ""
        epochs = r["max_iter"] * r["ims_per_batch"] / r["train_images"]
        lines.append(
            f"- {s.label}: {r['max_iter']} iterations of {r['ims_per_batch']} images = "
            f"{epochs:.2f} epochs of {r['train_images']} training images (SOLVER.EPOCHS "
            f"{r['epochs']:g}), {r['views']} views per image{speed}."
        )
    r = results[0]
    lines += [
        f"- kNN: weighted k = {KNN_K}, T = {KNN_T} on pooled backbone features, {opt.knn_train} "
        f"reference (train) and {opt.knn_test} test images, at the pretraining crop size.",
        "- Linear probe on the same frozen features (the transfer harness's cached-feature "
        f"classifier, SGD, cosine, batch 256, {opt.probe_epochs} epochs): lr chosen among "
        f"{opt.probe_num_lrs} log-spaced values in {list(opt.probe_lr_range)} on "
        f"{opt.probe_heldout_per_class} held-out reference images per class (seeded by the run), "
        f"then retrained on all {r['probe_train_images']} references; top-1 on "
        f"{r['probe_test_images']} test images.",
        f"- Nuclear norm: {opt.nuclear_views} views x {opt.nuclear_images} test images.",
        "",
        "## Hardware and wall time",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in hardware().items()]
    # A run whose train_stats.json was lost has no pretraining time: counted as 0 (shown "-")
    per_run = [(r["train_seconds"] or 0.0) + r["eval_seconds"] for r in results]
    lines += [
        f"- Wall time per run (pretraining + evaluation): mean {np.mean(per_run) / 60:.1f} min, "
        f"total {sum(per_run) / 60:.1f} min over {len(results)} runs.",
        *_invocation_lines(invocations),
        (
            "- This invocation of the study ran nothing: every run was recorded, and it rewrote "
            "this page from the records."
            if runs_done == 0
            else f"- This invocation of the study: {wall_seconds / 60:.1f} min (runs already "
            "done are skipped, so a resumed study takes less)."
        ),
        f"- Runs at once (`--jobs`): {opt.jobs}; with more than one, each run had "
        f"{threads_per_run(opt.jobs)} torch thread(s) and shared the machine, so "
        "its wall time is longer than alone.",
        "",
    ]
    return "\n".join(lines)


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


def write_plots(opt: StudyOptions, summaries: Sequence[MethodSummary], stem: str) -> list[tuple]:
    """Draw the study's figures as ``<stem>*.png``; returns ``[(title, path)]``: the per-seed
    values (``<stem>.png``) and, for a sweep, the metrics against its x (``<stem>_curves.png``)
    and for beta kNN against the test ‖Q̂‖∗ (``<stem>_accuracy_vs_nuclear_norm.png``, Fig. 3c)."""
    from transfer.analysis.plots import plot_scatter_means, plot_seed_spread, plot_sweep

    n_runs = sum(len(s.seeds) for s in summaries)
    drawn = [("Per-seed values and mean ± sample std", f"{stem}.png")]
    plot_seed_spread(
        {title: {s.label: s.values[k] for s in summaries} for k, (title, _) in METRICS.items()},
        drawn[0][1],
        title=f"{n_runs} runs: per-seed values (dots), mean ± sample std (bars)",
    )
    if not opt.sweep:
        return drawn
    keys = list(METRICS)
    curves: dict[str, dict[float, list[tuple[float, ...]]]] = {}
    for s in summaries:
        name = "MoCo-M" if s.key.startswith("mocom") else "LORAC"
        per_seed = [tuple(s.values[k][i] for k in keys) for i in range(len(s.seeds))]
        curves.setdefault(name, {})[opt.method_table[s.key].x] = per_seed
    xlabel = "β (MoCo-M: β = ∞, dashed)" if opt.sweep == "beta" else "views M"
    drawn.append(
        (f"The metrics against {'β' if opt.sweep == 'beta' else 'M'}", f"{stem}_curves.png")
    )
    plot_sweep(
        curves,
        drawn[-1][1],
        xlabel=xlabel,
        ylabels=[METRICS[k][0] for k in keys],
        log_x=opt.sweep == "beta",
        title=f"{len(summaries)} methods: mean ± sample std over seeds",
    )
    if opt.sweep == "beta":
        drawn.append(("kNN against the test ‖Q̂‖∗", f"{stem}_accuracy_vs_nuclear_norm.png"))
        plot_scatter_means(
            {
                s.label: list(zip(s.values["nuclear_mean"], s.values["knn_top1"], strict=True))
                for s in summaries
            },
            drawn[-1][1],
            xlabel=METRICS["nuclear_mean"][0],
            ylabel=METRICS["knn_top1"][0],
            title="kNN accuracy against the test ‖Q̂‖∗ (paper Fig. 3c)",
        )
    return drawn


def write_report(
    opt: StudyOptions,
    results: Sequence[Mapping],
    wall_seconds: float,
    runs_done: int | None = None,
) -> str:
    """Write ``opt.results`` (Markdown) and its plots beside it (same name, ``.png``, and for
    a sweep ``_curves.png`` ...); an invocation that ran ``runs_done`` > 0 runs is logged in the
    records first."""
    invocations = log_invocation(opt, wall_seconds, runs_done or 0)
    os.makedirs(os.path.dirname(os.path.abspath(opt.results)), exist_ok=True)
    summaries = summarize(results, opt.methods)
    png = write_plots(opt, summaries, os.path.splitext(opt.results)[0])[0][1]
    atomic_write_bytes(
        opt.results, render(opt, results, wall_seconds, png, invocations, runs_done).encode()
    )
    return png
