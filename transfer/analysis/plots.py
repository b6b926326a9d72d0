"""The analysis figures (matplotlib, Agg backend). Each function writes one PNG and returns how
many data values it drew, to check a figure against its CSV. beta = inf (the prior off) cannot
sit on a log axis: it is drawn past the largest finite beta, labelled with the infinity sign.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Point",
    "beta_text",
    "plot_accuracy_vs_nuclear",
    "plot_curves",
    "plot_embeddings",
    "plot_histograms",
    "plot_seed_spread",
    "plot_vs_beta",
]

INF_TEXT = "\u221e"  # the infinity sign
NUC = r"$\|\widehat{Q}\|_*$"  # mathtext for ||Q_hat||_*


@dataclass(frozen=True)
class Point:
    """One model in a sweep figure: ``x`` and ``y`` in data units, ``beta`` orders the curve."""

    label: str
    x: float
    y: float
    beta: float


def beta_text(beta: float) -> str:
    return INF_TEXT if math.isinf(beta) else f"{beta:g}"


def _save(fig: Figure, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_histograms(
    values: Mapping[str, Sequence[float]], path: str, *, views: int, title: str = ""
) -> dict[str, int]:
    """Overlaid histograms of ||Q_hat||_* per model (paper Fig. 4c), common bins, a dotted line
    at its minimum sqrt(views); returns the values counted per model."""
    if not values or not any(len(v) for v in values.values()):
        raise ValueError("plot_histograms: no values to plot")
    everything = np.concatenate([np.asarray(v, dtype=float) for v in values.values()])
    edges = np.histogram_bin_edges(everything, bins=min(50, max(5, len(everything) // 20)))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    counts = {}
    for i, (label, v) in enumerate(values.items()):
        arr = np.asarray(v, dtype=float)
        n, _, _ = ax.hist(arr, bins=edges, histtype="stepfilled", alpha=0.35, color=f"C{i}")
        ax.hist(
            arr,
            bins=edges,
            histtype="step",
            color=f"C{i}",
            label=f"{label} (mean {arr.mean():.2f})",
        )
        counts[label] = int(round(float(np.sum(n))))
    ax.axvline(math.sqrt(views), color="grey", ls=":", lw=1)
    ax.text(math.sqrt(views), ax.get_ylim()[1] * 0.95, f" \u221a{views}", color="grey", va="top")
    ax.set_xlabel(f"nuclear norm of {views} augmented views {NUC}")
    ax.set_ylabel("test images")
    ax.set_title(title or f"Histogram of {NUC} on test images (paper Fig. 4c)")
    ax.legend(fontsize="small")
    _save(fig, path)
    return counts


def _sweep_axes(ax: Axes, points: Sequence[Point], x_of: Callable[[Point], float]) -> None:
    """A log x axis whose ticks are the points' betas, infinity last (see the module doc)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    beta_at = {x_of(p): p.beta for p in points}
    ticks = sorted(beta_at)
    ax.set_xticks(ticks)
    ax.set_xticklabels([beta_text(beta_at[t]) for t in ticks])
    ax.set_xlim(ticks[0] / 2.0, ticks[-1] * 2.0)  # room for the point labels at both ends


def _inf_position(points: Sequence[Point]) -> float:
    finite = [p.beta for p in points if math.isfinite(p.beta)]
    return max(finite) * 4.0 if finite else 1.0


def plot_vs_beta(points: Sequence[Point], path: str, *, ylabel: str, title: str) -> int:
    """Mean ||Q_hat||_* against beta (paper Fig. 3b), the finite betas' means joined; returns
    the point count."""
    if not points:
        raise ValueError("plot_vs_beta: no points")
    x_inf = _inf_position(points)

    def x_of(p: Point) -> float:
        return p.beta if math.isfinite(p.beta) else x_inf

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    finite = [p for p in points if math.isfinite(p.beta)]
    if finite:
        betas = sorted({p.beta for p in finite})
        means = [float(np.mean([p.y for p in finite if p.beta == b])) for b in betas]
        ax.plot(betas, means, "-", color="C0", lw=1.5, label="finite \u03b2 (low-rank prior on)")
        ax.scatter([p.beta for p in finite], [p.y for p in finite], color="C0", zorder=3)
    others = [p for p in points if not math.isfinite(p.beta)]
    if others:
        ax.scatter(
            [x_inf] * len(others),
            [p.y for p in others],
            color="C3",
            marker="s",
            zorder=3,
            label=f"\u03b2 = {INF_TEXT} (prior off)",
        )
    for p in points:
        ax.annotate(p.label, (x_of(p), p.y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    _sweep_axes(ax, points, x_of)
    ax.set_xlabel("\u03b2")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    _save(fig, path)
    return len(points)


def plot_accuracy_vs_nuclear(points: Sequence[Point], path: str, *, ylabel: str, title: str) -> int:
    """Accuracy (y) against mean ||Q_hat||_* (x) (paper Fig. 3c); finite betas are joined in
    beta order, each point is labelled with its model and beta. Returns the point count."""
    if not points:
        raise ValueError("plot_accuracy_vs_nuclear: no points")
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    finite = sorted((p for p in points if math.isfinite(p.beta)), key=lambda p: p.beta)
    if len(finite) > 1:
        ax.plot([p.x for p in finite], [p.y for p in finite], "-", color="C0", lw=1, alpha=0.6)
    for p in points:
        inf = not math.isfinite(p.beta)
        ax.scatter([p.x], [p.y], color="C3" if inf else "C0", marker="s" if inf else "o", zorder=3)
        ax.annotate(
            f"{p.label} (\u03b2={beta_text(p.beta)})",
            (p.x, p.y),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
        )
    ax.margins(x=0.25, y=0.15)  # room for the point labels
    ax.set_xlabel(f"mean {NUC} on test images")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)
    return len(points)


def plot_curves(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str,
    *,
    ylabel: str,
    title: str,
) -> dict[str, int]:
    """One training metric against the iteration, one line per run (NaNs are gaps); +inf (beta
    while the prior is off) on a dotted line above the rest. Returns the points drawn per run."""
    finite_all = [y for _, ys in series.values() for y in ys if math.isfinite(y)]
    has_inf = any(math.isinf(y) and y > 0 for _, ys in series.values() for y in ys)
    top = max(finite_all) if finite_all else 1.0
    inf_level = top + 0.25 * (abs(top) or 1.0)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    drawn = {}
    for i, (label, (xs, ys)) in enumerate(series.items()):
        x = np.asarray(xs, dtype=float)
        y = np.asarray(ys, dtype=float)
        y = np.where(np.isposinf(y), inf_level, y)
        ok = np.isfinite(y)
        marker = "o" if ok.sum() <= 20 else None
        ax.plot(x, y, color=f"C{i}", label=label, marker=marker, ms=3)
        drawn[label] = int(ok.sum())
    if has_inf:
        ax.axhline(inf_level, color="grey", ls=":", lw=1)
        low, _ = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if low <= t < inf_level - 0.1 * (inf_level - low)]
        ticks = ticks if finite_all else []  # nothing finite: only the infinity tick means anything
        ax.set_yticks([*ticks, inf_level])
        ax.set_yticklabels([f"{t:g}" for t in ticks] + [f"{INF_TEXT} (off)"])
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if series:
        ax.legend(fontsize="small")
    _save(fig, path)
    return drawn


def plot_seed_spread(
    panels: Mapping[str, Mapping[str, Sequence[float]]], path: str, *, title: str = ""
) -> dict[str, int]:
    """One panel per metric (``{metric: {method: per-seed values}}``): dots per seed, the mean
    +- sample std (ddof = 1) as a bar. Returns the dots drawn per metric."""
    if not panels or not any(len(v) for m in panels.values() for v in m.values()):
        raise ValueError("plot_seed_spread: no values to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels) + 0.6, 3.6), squeeze=False)
    drawn = {}
    for ax, (metric, by_method) in zip(axes[0], panels.items(), strict=True):
        drawn[metric] = 0
        for i, values in enumerate(by_method.values()):
            v = np.asarray(values, dtype=float)
            if not len(v):
                continue
            offsets = np.linspace(-0.12, 0.12, len(v)) if len(v) > 1 else np.zeros(1)
            ax.scatter(i + offsets, v, color=f"C{i}", s=18, alpha=0.7, zorder=3)
            std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
            ax.errorbar(
                [i + 0.3], [v.mean()], yerr=[std], fmt="_", ms=14, color="k", capsize=4, zorder=4
            )
            drawn[metric] += len(v)
        ax.set_xticks(range(len(by_method)))
        ax.set_xticklabels(list(by_method), rotation=20)
        ax.set_xlim(-0.6, len(by_method) - 0.3)
        ax.set_title(metric, fontsize="medium")
        ax.margins(y=0.2)
    fig.suptitle(
        title or "per-seed values (dots), mean \u00b1 sample std (bars)", fontsize="medium"
    )
    _save(fig, path)
    return drawn


def plot_sweep(
    curves: Mapping[str, Mapping[float, Sequence[float]]],
    path: str,
    *,
    xlabel: str,
    ylabels: Sequence[str],
    log_x: bool = False,
    title: str = "",
) -> None:
    """One panel per metric: per curve (``{name: {x: per-seed tuples of the metrics}}``) the
    per-x mean +- sample std; an x of ``inf`` is a dashed horizontal line at its mean."""
    fig, axes = plt.subplots(
        1, len(ylabels), figsize=(3.8 * len(ylabels) + 0.6, 3.6), squeeze=False
    )
    for j, (ax, ylabel) in enumerate(zip(axes[0], ylabels, strict=True)):
        for i, (name, by_x) in enumerate(curves.items()):
            xs = sorted(x for x in by_x if math.isfinite(x))
            means = [float(np.mean([v[j] for v in by_x[x]])) for x in xs]
            stds = [
                float(np.std([v[j] for v in by_x[x]], ddof=1)) if len(by_x[x]) > 1 else 0.0
                for x in xs
            ]
            if xs:
                ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, color=f"C{i}", label=name)
            for x in by_x:
                if not math.isfinite(x):
                    mean = float(np.mean([v[j] for v in by_x[x]]))
                    ax.axhline(mean, ls="--", color=f"C{i}", label=f"{name}")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    _save(fig, path)


def plot_scatter_means(
    points: Mapping[str, Sequence[tuple[float, float]]],
    path: str,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
) -> None:
    """Per named point, its (x, y) per seed as small dots and their mean as a labelled marker
    (Fig. 3c's accuracy against nuclear norm)."""
    fig, ax = plt.subplots(figsize=(4.6, 3.8))
    for i, (name, xy) in enumerate(points.items()):
        a = np.asarray(xy, dtype=float)
        ax.scatter(a[:, 0], a[:, 1], s=10, alpha=0.4, color=f"C{i}")
        ax.scatter([a[:, 0].mean()], [a[:, 1].mean()], s=50, color=f"C{i}", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    ax.set_title(title, fontsize="medium")
    _save(fig, path)


def plot_embeddings(
    panels: Sequence[tuple[str, np.ndarray, np.ndarray]],
    path: str,
    *,
    class_names: Sequence[str] = (),
    title: str = "",
) -> int:
    """2-D embeddings side by side, one panel per ``(title, xy (N, 2), labels (N,))``, points
    coloured by class (one colour per class across panels, the legend naming them). Returns the
    points drawn."""
    labels_all = sorted({int(c) for _, _, labels in panels for c in labels})
    cmap = plt.get_cmap("tab10" if len(labels_all) <= 10 else "tab20")
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(labels_all)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    drawn = 0
    for ax, (name, xy, labels) in zip(axes[0], panels, strict=True):
        for c in labels_all:
            pts = xy[np.asarray(labels) == c]
            text = class_names[c] if c < len(class_names) else str(c)
            ax.scatter(pts[:, 0], pts[:, 1], s=9, color=colour[c], label=text, alpha=0.85)
            drawn += len(pts)
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    if len(labels_all) <= 20:
        axes[0][-1].legend(fontsize="x-small", markerscale=1.5, loc="center left",
                           bbox_to_anchor=(1.0, 0.5))  # fmt: skip
    if title:
        fig.suptitle(title, fontsize="medium")
    _save(fig, path)
    return drawn
