"""What a study shows about LORAC vs MoCo-M, in numbers and words: the table and the sentences
that its Markdown page (:mod:`.page`) and the HTML report both show, computed from the same
records. Every conclusion is a row of :data:`CLAIMS`: what a comparison may claim for each
outcome of its numbers (:func:`outcome`), so that no tie, NaN or overlapping interval is read as
a difference."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transfer.analysis.paper_tables import PAPER_TABLES
from transfer.analysis.report_tables import Table

from .experiments import StudyOptions
from .stats import (
    METRICS,
    NEVER_ON,
    MethodSummary,
    PairedDifference,
    mean_std,
    paired_difference,
)

__all__ = [
    "CLAIMS",
    "PAPER_SHAPES",
    "TITLES",
    "Comparison",
    "comparison",
    "mean_table",
    "outcome",
    "paired_table",
    "paired_verdict",
    "paper_main_comparison",
    "spread_sentence",
    "verdict",
]

TITLES = {
    "": "CPU-scale study: LORAC vs MoCo-M vs MoCo-v2 on Fashion-MNIST",
    "beta": "CPU-scale β sweep (paper Fig. 3): LORAC at five β and MoCo-M",
    "views": "CPU-scale M sweep (paper Fig. 4b): LORAC and MoCo-M at M views",
}

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

SWEEP_TITLE = "The sweep"
PAIRED_TITLE = "LORAC − MoCo-M, paired by seed"
_ACCURACIES = (("knn_top1", "kNN"), ("linear_top1", "linear-probe"))

_NO_COLLAPSE = "no collapse at β = {x} (the paper's collapse below β = 1 is not seen)"
# What each comparison may claim, by the outcome of its numbers. A LORAC - MoCo-M difference is
# "above" / "below" when it lies beyond the seed spread on that side (its paired 95 % interval
# excludes 0; unpaired, the mean difference exceeds the larger of the two seed stds), "within"
# when it does not, "one seed" when there is no spread to compare with (NaN: fewer than two
# seeds). "tie": values equal at the digits the page shows, from which no peak or trend is read;
# "never on": LORAC's prior never turned on, so LORAC is MoCo-M under another name; "missing":
# a method of the comparison was not run. An outcome a row does not list is never claimed.
CLAIMS: dict[str, dict[str, str]] = {
    "study": {  # the whole study page, before any number is read
        "missing": "LORAC and MoCo-M were not both run, so there is no LORAC vs MoCo-M comparison.",
        "never on": f"LORAC's prior never turned on ({NEVER_ON}): LORAC and MoCo-M trained the "
        "same objective, so this study draws no LORAC vs MoCo-M conclusion.",
    },
    "unpaired": {  # one accuracy's means against the seed spread
        "above": "LORAC beats MoCo-M",
        "below": "MoCo-M beats LORAC",
        "within": "within the seed spread",
        "one seed": "With a single seed per method there is no seed spread, so this study cannot "
        "say whether LORAC beats MoCo-M.",
    },
    "paired": {  # one accuracy's paired difference
        "above": "LORAC beats MoCo-M beyond the seed spread",
        "below": "MoCo-M beats LORAC beyond the seed spread",
        "within": "no difference beyond the seed spread at this scale",
        "one seed": "Fewer than two common seeds: no paired interval.",
    },
    "where": {  # a sweep's paired kNN differences, grouped by outcome
        "above": "LORAC is above MoCo-M beyond the seed spread at {symbol} = {at}",
        "below": "below it beyond the seed spread at {symbol} = {at}",
        "within": "within it at {symbol} = {at}",
        "none": "at no {symbol} does LORAC differ from MoCo-M in kNN beyond the seed spread "
        "(every paired 95 % CI includes 0)",
    },
    "sweep": {  # a sweep as a whole
        "one seed": "Here: one seed (no seed spread, no interval), so no peak, trend or gap is "
        "read from these numbers.",
        "never on β": f"Here: no LORAC run turned its prior on ({NEVER_ON} at β = {{at}}), so "
        "the sweep says nothing about β.",
        "never on M": "Here: no LORAC run turned its prior on (β = ∞ throughout), so the sweep "
        "says nothing about M.",
        "left out": f" LORAC at β = {{at}} is left out: {NEVER_ON}.",
    },
    "peak": {  # the β sweep's highest kNN mean
        "one": "kNN is highest at β = {at} ({top} %; the paper's peak is at β = 2)",
        "tie": "kNN ties at its top ({top} %) at β = {at}, so no peak is read",
    },
    "trend": {  # the test ‖Q̂‖∗ means in β order
        "tie": "the test ‖Q̂‖∗ ties at β = {at}, so no trend is read",
        "grows": "the test ‖Q̂‖∗ grows with β (as the paper's Fig. 3b)",
        "other": "the test ‖Q̂‖∗ does not grow monotonically with β (unlike the paper's Fig. 3b)",
    },
    "collapse": {  # LORAC at the lowest β against MoCo-M, paired kNN
        "below": "at β = {x} kNN is below MoCo-M's beyond the seed spread, as the paper's "
        "collapse below β = 1",
        "above": _NO_COLLAPSE,
        "within": _NO_COLLAPSE,
    },
    "gap": {"grows": "growing", "other": "not growing"},  # the views sweep's kNN gap over M
}


def outcome(d: PairedDifference) -> str:
    """The :data:`CLAIMS` key of ``d``: "above", "below", "within" or "one seed" (no interval)."""
    if math.isnan(d.low):
        return "one seed"
    return {1: "above", -1: "below", 0: "within"}[d.beyond_spread]


@dataclass
class Comparison:
    """What one study or sweep shows about LORAC vs MoCo-M: title, sentences and table (without
    rows when there is nothing to compare)."""

    title: str
    text: list[str]
    table: Table


def comparison(opt: StudyOptions, summaries: Sequence[MethodSummary]) -> Comparison:
    if opt.sweep:  # per x: each method's means, LORAC - MoCo-M paired; and what they show
        by = {s.key: s for s in summaries}
        rows, sentence = (_beta_sweep if opt.sweep == "beta" else _views_sweep)(opt, by)
        table = Table.of_rows(SWEEP_TITLE, list(rows[0]) if rows else ["x"], rows)
        text = [PAPER_SHAPES[opt.sweep], *([sentence] if sentence else [])]
    else:
        table = paired_table(summaries)
        pair = _lorac_and_mocom(summaries)
        if pair and pair[0].never_on:
            found = [CLAIMS["study"]["never on"]]
        else:
            found = [paired_verdict(summaries), verdict(summaries)]
        text = [t for t in (*found, paper_main_comparison()) if t]
    return Comparison(TITLES[opt.sweep], text, table)


def _lorac_and_mocom(summaries: Sequence[MethodSummary]) -> tuple[MethodSummary, ...]:
    """``(lorac, mocom)`` when both ran, else ()."""
    by = {s.key: s for s in summaries}
    return (by["lorac"], by["mocom"]) if "lorac" in by and "mocom" in by else ()


def verdict(summaries: Sequence[MethodSummary]) -> str:
    """One sentence: does LORAC's kNN (and linear) mean beat MoCo-M's by more than the larger
    of their two seed standard deviations, or is the difference within the seed spread?"""
    pair = _lorac_and_mocom(summaries)
    if not pair:
        return CLAIMS["study"]["missing"]
    lorac, mocom = pair
    if min(len(lorac.seeds), len(mocom.seeds)) < 2:
        return CLAIMS["unpaired"]["one seed"]
    parts = []
    for metric, name in _ACCURACIES:
        diff = lorac.mean(metric) - mocom.mean(metric)
        spread = max(lorac.std(metric), mocom.std(metric))
        found = "above" if diff > spread else "below" if diff < -spread else "within"
        parts.append(
            f"on {name} top-1 LORAC's mean is {abs(diff):.2f} points "
            f"{'above' if diff >= 0 else 'below'} MoCo-M's against a seed spread of "
            f"{spread:.2f} points ({CLAIMS['unpaired'][found]})"
        )
    return (
        f"Unpaired, {parts[0]}, and {parts[1]}, the seed spread being the larger of the two "
        f"methods' sample standard deviations over {len(lorac.seeds)} and {len(mocom.seeds)} "
        "seeds. Where the two disagree, the paired interval is the one this page goes by: it "
        "removes the variation that a seed gives both methods alike (the same data order and "
        "initial weights), which the unpaired comparison counts as spread."
    )


def paired_verdict(summaries: Sequence[MethodSummary]) -> str:
    """One sentence per accuracy: does the paired 95 % interval of LORAC - MoCo-M exclude 0?"""
    pair = _lorac_and_mocom(summaries)
    if not pair:
        return ""
    diffs = [(name, paired_difference(*pair, metric)) for metric, name in _ACCURACIES]
    if any(outcome(d) == "one seed" for _, d in diffs):
        return CLAIMS["paired"]["one seed"]
    knn, linear = (
        f"{name} top-1 {d.mean:+.2f} points, 95 % CI [{d.low:+.2f}, {d.high:+.2f}] "
        f"({CLAIMS['paired'][outcome(d)]})"
        for name, d in diffs
    )
    return f"Paired by seed ({len(diffs[0][1].seeds)} seeds), LORAC - MoCo-M: {knn}; {linear}."


def spread_sentence(symbol: str, gaps: Sequence[tuple[float, PairedDifference]]) -> str:
    """Where the paired kNN interval of LORAC - MoCo-M excludes 0, in words."""
    at = {r: ", ".join(f"{x:g}" for x, d in gaps if outcome(d) == r) for r in CLAIMS["where"]}
    if not at["above"] and not at["below"]:
        return CLAIMS["where"]["none"].format(symbol=symbol)
    found = [r for r in ("above", "below", "within") if at[r]]
    return ", ".join(CLAIMS["where"][r].format(symbol=symbol, at=at[r]) for r in found)


def _beta_sentence(found: Sequence[tuple[float, float, float, PairedDifference]]) -> str:
    """What the sweep shows beside the paper's Fig. 3, from means as shown on the page: no peak
    from tied means, no trend from tied norms, nothing at all from one seed."""
    if any(outcome(f[3]) == "one seed" for f in found):
        return CLAIMS["sweep"]["one seed"]
    ordered = sorted(found, key=lambda f: f[0])
    digits, nuc_digits = METRICS["knn_top1"][1], METRICS["nuclear_mean"][1]
    knn = [round(f[1], digits) for f in ordered]
    peaks = [f"{f[0]:g}" for f, v in zip(ordered, knn, strict=True) if v == max(knn)]
    peak = CLAIMS["peak"]["tie" if len(peaks) > 1 else "one"]
    nuc = [round(f[2], nuc_digits) for f in ordered]
    tied = [f"{f[0]:g}" for f, v in zip(ordered, nuc, strict=True) if nuc.count(v) > 1]
    grows = all(a[2] < b[2] for a, b in zip(ordered, ordered[1:], strict=False))
    trend = CLAIMS["trend"]["tie" if tied else "grows" if grows else "other"]
    low = ordered[0]
    return (
        f"Here: {peak.format(at=', '.join(peaks), top=f'{max(knn):.{digits}f}')}; "
        f"{trend.format(at=', '.join(tied))}; "
        f"{CLAIMS['collapse'][outcome(low[3])].format(x=f'{low[0]:g}')}; "
        f"{spread_sentence('β', [(f[0], f[3]) for f in ordered])}."
    )


def paper_main_comparison() -> str:
    """The paper's own LORAC vs MoCo-M numbers (linear top-1, one run each), read from the
    transcribed tables so that they are written down once."""
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


def mean_table(summaries: Sequence[MethodSummary]) -> Table:
    """One row per method: its label, seeds and every metric's mean ± sample std."""
    table = Table(
        "Mean ± sample standard deviation over seeds",
        ["Method", "seeds", *(title for title, _ in METRICS.values())],
    )
    for s in summaries:
        table.add([s.label, len(s.seeds), *(mean_std(s, k) for k in METRICS)])
    return table


def paired_table(summaries: Sequence[MethodSummary]) -> Table:
    """LORAC - MoCo-M per common seed for every metric, then the mean [95 % CI]; no rows unless
    both methods ran."""
    table = Table(PAIRED_TITLE, ["seed", *(title for title, _ in METRICS.values())])
    pair = _lorac_and_mocom(summaries)
    if not pair:
        return table
    pairs = {k: paired_difference(*pair, k) for k in METRICS}
    for i, seed in enumerate(pairs["knn_top1"].seeds):
        table.add(
            [seed, *(f"{pairs[k].diffs[i]:+.{digits}f}" for k, (_, digits) in METRICS.items())]
        )
    table.add(
        ["mean [95 % CI]", *(pairs[k].interval(digits) for k, (_, digits) in METRICS.items())]
    )
    return table


def _beta_sweep(opt: StudyOptions, by: Mapping[str, MethodSummary]) -> tuple[list[dict], str]:
    """Per β: the means and LORAC - MoCo-M's paired kNN; the sentence on the peak, the test
    ‖Q̂‖∗'s trend and the collapse at the lowest β, from the runs whose prior turned on."""
    mocom = by.get("mocom")
    rows: list[dict] = []
    found = []  # (beta, kNN mean, ‖Q̂‖∗ mean, paired kNN difference)
    never = []  # the betas whose LORAC runs never turned their prior on
    for key in opt.methods:
        if key not in by:
            continue
        s, x = by[key], opt.method_table[key].x
        beta = "∞ (MoCo-M)" if x == math.inf else f"{x:g}"
        if s.never_on:
            beta = f"∞ (prior never on; set {x:g})"
        row = {"β": beta, "seeds": len(s.seeds)}
        row.update({METRICS[k][0]: mean_std(s, k) for k in METRICS})
        if mocom is not None and key != "mocom":
            d = paired_difference(s, mocom, "knn_top1")
            row["kNN − MoCo-M [95 % CI]"] = d.interval()
            if s.never_on:
                never.append(f"{x:g}")
            else:
                found.append((x, s.mean("knn_top1"), s.mean("nuclear_mean"), d))
        rows.append(row)
    at = ", ".join(never)
    if found:
        left_out = CLAIMS["sweep"]["left out"].format(at=at) if never else ""
        return rows, _beta_sentence(found) + left_out
    return rows, CLAIMS["sweep"]["never on β"].format(at=at) if never else ""


def _views_sweep(opt: StudyOptions, by: Mapping[str, MethodSummary]) -> tuple[list[dict], str]:
    """Per M: LORAC's and MoCo-M's kNN and their paired differences; the sentence on where the
    kNN gap exceeds the seed spread and whether it grows with M."""
    rows: list[dict] = []
    gaps = []
    never = []
    for x in sorted({opt.method_table[k].x for k in opt.methods}):
        lo, mo = by.get(f"lorac_M{x:g}"), by.get(f"mocom_M{x:g}")
        if lo is None or mo is None:
            continue
        d = paired_difference(lo, mo, "knn_top1")
        (never if lo.never_on else gaps).append((x, d))  # never: its gap is MoCo-M's to itself
        rows.append(
            {
                "M": f"{x:g} (LORAC's {NEVER_ON})" if lo.never_on else f"{x:g}",
                "seeds": len(d.seeds),
                "LORAC kNN (%)": mean_std(lo, "knn_top1"),
                "MoCo-M kNN (%)": mean_std(mo, "knn_top1"),
                "kNN LORAC − MoCo-M [95 % CI]": d.interval(),
                "linear LORAC − MoCo-M [95 % CI]": paired_difference(
                    lo, mo, "linear_top1"
                ).interval(),
            }
        )
    if not gaps:
        return rows, CLAIMS["sweep"]["never on M"] if never else ""
    if any(outcome(d) == "one seed" for _, d in gaps):
        return rows, CLAIMS["sweep"]["one seed"]
    (first, d0), (last, d1) = gaps[0], gaps[-1]
    return rows, (
        f"Here: {spread_sentence('M', gaps)}; the mean kNN gap is {d0.mean:+.2f} at M = "
        f"{first:g} and {d1.mean:+.2f} at M = {last:g} "
        f"({CLAIMS['gap']['grows' if d1.mean > d0.mean else 'other']} with M)."
    )
