"""A study's numbers and words (transfer.study.stats, .study_comparison): the sample
std, the seed-paired difference and its t interval checked by hand, and the sentences that say
what they show."""

from __future__ import annotations

import pytest

from transfer.study.comparison import (
    paired_verdict,
    paper_main_comparison,
    spread_sentence,
    verdict,
)
from transfer.study.experiments import METHODS
from transfer.study.stats import MethodSummary, PairedDifference, paired_difference


def _summary(key: str, knn: list[float], linear: list[float]) -> MethodSummary:
    values = {"knn_top1": knn, "linear_top1": linear, "nuclear_mean": [6.0] * len(knn)}
    return MethodSummary(key, METHODS[key].label, list(range(len(knn))), values)


def test_verdict_compares_the_mean_difference_with_the_larger_seed_std():
    mocom = _summary("mocom", [70.0, 72.0, 74.0], [80.0, 80.5, 81.0])  # stds 2.0 and 0.5
    assert mocom.std("knn_top1") == pytest.approx(2.0)  # ddof = 1
    beats = verdict([_summary("lorac", [75.0, 75.5, 76.0], [79.0, 79.5, 80.0]), mocom])
    assert "kNN top-1 LORAC's mean is 3.50 points above MoCo-M's" in beats
    assert "seed spread of 2.00 points (LORAC beats MoCo-M)" in beats
    assert "1.00 points below MoCo-M's against a seed spread of 0.50 points (MoCo-M beats" in beats
    within = verdict([_summary("lorac", [73.0, 73.5, 74.0], [80.5, 80.5, 80.5]), mocom])
    assert within.count("(within the seed spread)") == 2
    one_seed = verdict([_summary("lorac", [75.0], [80.0]), _summary("mocom", [70.0], [80.0])])
    assert "single seed" in one_seed
    assert "not both run" in verdict([mocom])


def test_paired_difference_and_its_interval():
    """Per-seed differences, their mean and the Student-t 95 % interval (checked by hand:
    diffs 1, 2, 3 -> mean 2, sd 1, t(0.975, 2) = 4.303, half width 4.303 / sqrt(3) = 2.484)."""
    lorac = _summary("lorac", [71.0, 74.0, 77.0], [81.0, 81.1, 81.2])
    mocom = _summary("mocom", [70.0, 72.0, 74.0], [80.0, 80.0, 80.0])
    d = paired_difference(lorac, mocom, "knn_top1")
    assert d.diffs == [1.0, 2.0, 3.0] and d.mean == pytest.approx(2.0)
    assert (d.low, d.high) == pytest.approx((2.0 - 2.4841, 2.0 + 2.4841), abs=1e-3)
    assert d.beyond_spread == 0  # the interval includes 0
    linear = paired_difference(lorac, mocom, "linear_top1")
    assert linear.beyond_spread == 1  # diffs 1.0, 1.1, 1.2: [0.85, 1.35] excludes 0
    assert paired_difference(mocom, lorac, "linear_top1").beyond_spread == -1
    text = paired_verdict([lorac, mocom])
    assert "kNN top-1 +2.00 points" in text and "no difference beyond the seed spread" in text
    assert "linear-probe top-1 +1.10 points" in text and "LORAC beats MoCo-M beyond" in text


def test_main_comparison_quotes_the_papers_numbers():
    """The paper's LORAC - MoCo-M (Tables 1 and 5 as transcribed) sits beside ours."""
    text = paper_main_comparison()
    assert "+0.7 points on ImageNet-1K (ResNet-50, 200 epochs, Table 1: 73.2 vs 72.5)" in text
    assert "+1.7 points on ImageNet-100 (ResNet-18, 100 epochs, Table 5: 78.7 vs 77.0)" in text


def test_spread_sentence_says_when_no_interval_excludes_zero():
    """The sweep's sentence never lists empty sets ("at β = none"): with every paired interval
    including 0 it says so, and it names the points above and below otherwise."""

    def gap(low, high):
        return PairedDifference("knn_top1", [0, 1, 2], [0.0] * 3, (low + high) / 2, low, high)

    within = spread_sentence("β", [(0.5, gap(-0.3, 0.1)), (1.0, gap(-0.1, 0.2))])
    assert within == (
        "at no β does LORAC differ from MoCo-M in kNN beyond the seed spread (every paired "
        "95 % CI includes 0)"
    )
    mixed = spread_sentence("M", [(2.0, gap(0.1, 0.4)), (3.0, gap(-0.5, -0.1)), (4.0, gap(-1, 1))])
    assert mixed == (
        "LORAC is above MoCo-M beyond the seed spread at M = 2, below it beyond the seed spread "
        "at M = 3, within it at M = 4"
    )
    assert "none" not in within + mixed
