"""The collapse diagnostics against plain numpy implementations and analytic values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pretrain.evaluation.collapse import (
    alignment,
    collapse_stats,
    effective_rank,
    feature_std,
    is_collapsed,
    uniformity,
)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _np_effective_rank(x: np.ndarray) -> float:
    z = _unit(x)
    s = np.linalg.svd(z - z.mean(0), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _np_pairs(x: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Squared distances of the unit rows over the pairs a < b (of one label if given)."""
    z = _unit(x)
    out = []
    for a in range(len(z)):
        for b in range(a + 1, len(z)):
            if labels is None or labels[a] == labels[b]:
                out.append(((z[a] - z[b]) ** 2).sum())
    return np.array(out)


@pytest.fixture
def gaussian() -> torch.Tensor:
    return torch.randn(3000, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_isotropic_gaussian_has_full_effective_rank_and_isotropic_std(gaussian):
    assert 15.5 < effective_rank(gaussian) <= 16.0
    assert feature_std(gaussian) == pytest.approx(1 / math.sqrt(16), rel=0.03)
    stats = collapse_stats(gaussian, torch.arange(3000) % 10)
    assert stats.std_ratio == pytest.approx(1.0, rel=0.03)
    assert not is_collapsed(stats)


def test_rank_one_and_constant_embeddings_are_collapsed():
    g = torch.Generator().manual_seed(1)
    u, c = torch.randn(32, generator=g), torch.randn(32, generator=g)
    rank1 = torch.randn(500, 1, generator=g) * u  # one line through 0: unit rows are +-u
    assert effective_rank(rank1) == pytest.approx(1.0, abs=1e-6)
    assert is_collapsed(collapse_stats(rank1, torch.arange(500) % 5))
    constant = c.repeat(200, 1)
    stats = collapse_stats(constant, torch.arange(200) % 5)
    assert stats.effective_rank == 0.0 and stats.std == pytest.approx(0.0, abs=1e-7)
    assert stats.alignment == pytest.approx(0.0, abs=1e-7)
    assert stats.uniformity == pytest.approx(0.0, abs=1e-7)  # log mean exp(0)
    assert is_collapsed(stats)


def test_effective_rank_of_equal_orthogonal_directions_is_their_number():
    # rows +-e_k for k < 4 (the mean is 0): singular values all equal -> erank exactly 4
    eye = torch.eye(8)[:4]
    x = torch.cat([eye, -eye]).repeat(3, 1)
    assert effective_rank(x) == pytest.approx(4.0, abs=1e-9)


def test_diagnostics_match_plain_numpy(gaussian):
    x = gaussian[:60] @ torch.diag(torch.linspace(0.1, 3, 16, dtype=torch.float64))
    labels = torch.arange(60) % 4
    xn, ln = x.numpy(), labels.numpy()
    assert effective_rank(x) == pytest.approx(_np_effective_rank(xn), rel=1e-9)
    assert feature_std(x) == pytest.approx(_unit(xn).std(0, ddof=1).mean(), rel=1e-9)
    assert alignment(x, labels) == pytest.approx(_np_pairs(xn, ln).mean(), rel=1e-9)
    assert uniformity(x) == pytest.approx(np.log(np.exp(-2 * _np_pairs(xn)).mean()), rel=1e-9)


def test_uniformity_subsamples_evenly_and_alignment_needs_a_pair(gaussian):
    assert uniformity(gaussian, max_points=50) == pytest.approx(
        uniformity(gaussian[torch.linspace(0, 2999, 50).long()]), rel=1e-12
    )
    assert math.isnan(alignment(gaussian[:5], torch.arange(5)))
    with pytest.raises(ValueError, match="one label per row"):
        alignment(gaussian[:5], torch.arange(4))
