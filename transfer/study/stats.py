"""A study's numbers: per method the per-seed values, their mean and sample standard deviation,
and the seed-paired difference of two methods with its Student-t 95 % interval. A method whose
prior never turned on (:func:`prior_never_on`) is labelled so wherever it is shown."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "METRICS",
    "NEVER_ON",
    "MethodSummary",
    "PairedDifference",
    "mean_std",
    "never_on_label",
    "paired_difference",
    "prior_never_on",
    "summarize",
]

# study.json key -> (column title, digits)
METRICS = {
    "knn_top1": ("kNN top-1 (%)", 2),
    "linear_top1": ("linear top-1 (%)", 2),
    "nuclear_mean": ("test ‖Q̂‖∗", 3),
}


NEVER_ON = "prior never on: β = ∞ throughout"


def prior_never_on(record: Mapping) -> bool:
    """Whether a study run with a prior trained with beta = inf throughout (MoCo-M in all but
    name): its training ended by the iteration its prior turns on, or its beta is inf. False
    without a prior or a ``prior_on_iter``."""
    on = record.get("prior_on_iter")
    if on is None:
        return False
    return on >= record["max_iter"] or math.isinf(record.get("beta", 0.0))


def never_on_label(label: str, never_on: bool) -> str:
    """``label``, marked :data:`NEVER_ON` when its prior never turned on."""
    return f"{label} ({NEVER_ON})" if never_on else label


@dataclass
class MethodSummary:
    key: str
    label: str  # marked NEVER_ON when never_on
    seeds: list[int]
    values: dict[str, list[float]]  # metric -> per-seed values, in seed order
    never_on: bool = False  # the prior of some run never turned on: its numbers are MoCo-M's

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
            never = any(prior_never_on(r) for r in rows)
            label = never_on_label(rows[0]["label"], never)
            out.append(MethodSummary(m, label, [r["seed"] for r in rows], values, never))
    return out


def mean_std(s: MethodSummary, metric: str) -> str:
    """``mean ± std`` at the metric's digits ("n/a" for the std of a single seed)."""
    digits = METRICS[metric][1]
    std = s.std(metric)
    std_text = "n/a" if math.isnan(std) else f"{std:.{digits}f}"
    return f"{s.mean(metric):.{digits}f} ± {std_text}"


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

    def interval(self, digits: int = 2) -> str:
        """``+mean [+low, +high]``; with fewer than two common seeds, why there is none."""
        if not self.diffs:
            return "no common seed: no difference"
        if math.isnan(self.low):
            return f"{self.mean:+.{digits}f} (one seed: no interval)"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


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
