"""A study's figures: the per-seed values of every method and, for a sweep, the metrics against
its x and (β sweep) kNN against the test ‖Q̂‖∗ (paper Fig. 3c), drawn by :mod:`.plots`. A method
whose prior never turned on is labelled so, never drawn as a point of LORAC's β curve."""

from __future__ import annotations

import math
from collections.abc import Sequence

from transfer.analysis.plots import plot_scatter_means, plot_seed_spread, plot_sweep

from .experiments import StudyOptions
from .stats import METRICS, NEVER_ON, MethodSummary

__all__ = ["write_plots"]


def write_plots(opt: StudyOptions, summaries: Sequence[MethodSummary], stem: str) -> list[tuple]:
    """Draw the study's figures as ``<stem>*.png``; returns ``[(title, path)]``."""
    drawn = [_seed_spread(summaries, f"{stem}.png")]
    if opt.sweep:
        drawn.append(_sweep_curves(opt, summaries, f"{stem}_curves.png"))
    if opt.sweep == "beta":
        drawn.append(_accuracy_vs_nuclear(summaries, f"{stem}_accuracy_vs_nuclear_norm.png"))
    return drawn


def _seed_spread(summaries: Sequence[MethodSummary], path: str) -> tuple[str, str]:
    n_runs = sum(len(s.seeds) for s in summaries)
    plot_seed_spread(
        {title: {s.label: s.values[k] for s in summaries} for k, (title, _) in METRICS.items()},
        path,
        title=f"{n_runs} runs: per-seed values (dots), mean ± sample std (bars)",
    )
    return "Per-seed values and mean ± sample std", path


def _sweep_curves(
    opt: StudyOptions, summaries: Sequence[MethodSummary], path: str
) -> tuple[str, str]:
    keys = list(METRICS)
    curves: dict[str, dict[float, list[tuple[float, ...]]]] = {}
    beta = opt.sweep == "beta"
    for s in summaries:
        name = "MoCo-M" if s.key.startswith("mocom") else "LORAC"
        x = opt.method_table[s.key].x
        if s.never_on:  # not a point of LORAC's curve: at β = ∞ (a dashed line), or apart
            name, x = (s.label, math.inf) if beta else (f"LORAC ({NEVER_ON})", x)
        per_seed = [tuple(s.values[k][i] for k in keys) for i in range(len(s.seeds))]
        curves.setdefault(name, {})[x] = per_seed
    plot_sweep(
        curves,
        path,
        xlabel="β (MoCo-M: β = ∞, dashed)" if beta else "views M",
        ylabels=[METRICS[k][0] for k in keys],
        log_x=beta,
        title=f"{len(summaries)} methods: mean ± sample std over seeds",
    )
    return f"The metrics against {'β' if beta else 'M'}", path


def _accuracy_vs_nuclear(summaries: Sequence[MethodSummary], path: str) -> tuple[str, str]:
    plot_scatter_means(
        {
            s.label: list(zip(s.values["nuclear_mean"], s.values["knn_top1"], strict=True))
            for s in summaries
        },
        path,
        xlabel=METRICS["nuclear_mean"][0],
        ylabel=METRICS["knn_top1"][0],
        title="kNN accuracy against the test ‖Q̂‖∗ (paper Fig. 3c)",
    )
    return "kNN against the test ‖Q̂‖∗", path
