"""Collapse and rank diagnostics of an embedding: effective rank, per-dimension std, alignment
and uniformity, on features already computed (the kNN monitor's; no forward pass here).

Every function takes the raw features ``(N, D)`` and L2-normalises them itself (z = x / ||x||):

* **effective rank** (Roy & Vetterli 2007): with s_1..s_r the singular values of the centred
  matrix Z - mean(Z), p_k = s_k / sum(s), erank = exp(-sum_k p_k log p_k), in [1, min(N, D)].
  It counts the directions the embedding spreads in: 1 for a rank-1 embedding, D for an isotropic
  one (N >> D). Centred because ResNet features are non-negative (after the last ReLU) and share a
  large mean direction that says nothing about collapse. An embedding that does not vary at all
  (every s_k = 0) has effective rank 0.
* **per-dimension std** (SimSiam, Chen & He 2021, Sec. 4.1): the std over the N samples of each
  coordinate of z, averaged over the D coordinates. Unit vectors spread isotropically have
  std ~ 1/sqrt(D); a collapsed embedding has std 0. ``std_ratio`` = std * sqrt(D) puts it on a
  scale where 1 is isotropic.
* **alignment** (Wang & Isola 2020, alpha = 2): E ||z_a - z_b||^2 over positive pairs (a, b).
  The caller says which pairs are positive by a label per row: every two distinct rows with the
  same label (the monitor passes class labels: *class* alignment, the kNN's own notion of
  neighbour, since the monitor embeds one view per image). In [0, 4]; 0 when each class maps to
  one point.
* **uniformity** (Wang & Isola 2020, t = 2): log E exp(-t ||z_a - z_b||^2) over all pairs of
  distinct rows (their ``torch.pdist`` form), on at most ``max_points`` evenly spaced rows. In
  [-4t, 0]: 0 for a constant embedding, lower is more uniform on the sphere.

:func:`collapse_stats` returns all four; :func:`is_collapsed` applies the documented thresholds
(:data:`MIN_EFFECTIVE_RANK`, :data:`MIN_STD_RATIO`) that the monitor's warning uses.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "MIN_EFFECTIVE_RANK",
    "MIN_STD_RATIO",
    "CollapseStats",
    "alignment",
    "collapse_stats",
    "effective_rank",
    "feature_std",
    "is_collapsed",
    "uniformity",
]

# The warning's thresholds. An effective rank under 2 is one direction (plus noise): a dimensional
# collapse. A per-dimension std under a tenth of the isotropic 1/sqrt(D) is SimSiam's complete
# collapse (its collapsed runs reach std ~ 0; healthy ones stay near 1/sqrt(D)).
MIN_EFFECTIVE_RANK = 2.0
MIN_STD_RATIO = 0.1

_UNIFORMITY_T = 2.0
_MAX_POINTS = 2048  # pdist on 2048 rows: 2.1 M pairs (all four numbers of 12,000 x 512: 1.7 s, CPU)


def _unit(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.shape[0] < 2:
        raise ValueError(f"need features of shape (N >= 2, D), got {tuple(x.shape)}")
    return F.normalize(x.double(), dim=1)  # double: the sums over many pairs stay exact enough


def effective_rank(x: torch.Tensor) -> float:
    """Roy & Vetterli's effective rank of the centred, L2-normalised ``x`` (N, D); 0 for an
    embedding that does not vary."""
    z = _unit(x)
    zc = z - z.mean(0, keepdim=True)
    # singular values from the (D, D) Gram matrix: cheaper than an SVD of (N, D) for N >> D
    ev = torch.linalg.eigvalsh(zc.t() @ zc)
    s = torch.where(ev > 1e-12 * ev.max(), ev, 0.0).sqrt()  # rounding noise is no direction
    total = s.sum()
    if total <= 1e-9 * math.sqrt(z.shape[0]):  # no variation at all (rounding only)
        return 0.0
    p = s / total
    p = p[p > 0]
    return math.exp(-(p * p.log()).sum().item())


def feature_std(x: torch.Tensor) -> float:
    """Mean over the D coordinates of the std over the N rows of the L2-normalised ``x``."""
    return _unit(x).std(0).mean().item()


def alignment(x: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean ||z_a - z_b||^2 over the pairs of distinct rows with the same label (NaN if none).

    For unit rows ||z_a - z_b||^2 = 2 - 2 z_a.z_b, and the sum of z_a.z_b over the ordered
    pairs of distinct rows of a class c is ||sum_c z||^2 - n_c: no N x N matrix."""
    z = _unit(x)
    labels = torch.as_tensor(labels, device=z.device).long()
    if labels.shape != (z.shape[0],):
        raise ValueError(f"need one label per row: {tuple(labels.shape)} for {z.shape[0]} rows")
    _, idx, counts = labels.unique(return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), z.shape[1], dtype=z.dtype, device=z.device)
    sums.index_add_(0, idx, z)  # (C, D)
    counts = counts.to(z.dtype)
    pairs = (counts * (counts - 1)).sum()  # ordered pairs
    if pairs == 0:
        return math.nan
    dots = (sums.pow(2).sum(1) - counts).sum()  # sum of z_a.z_b over those pairs
    return (2.0 - 2.0 * dots / pairs).clamp_min(0.0).item()


def uniformity(x: torch.Tensor, t: float = _UNIFORMITY_T, max_points: int = _MAX_POINTS) -> float:
    """log of the mean exp(-t ||z_a - z_b||^2) over the pairs of distinct rows (at most
    ``max_points`` rows, evenly spaced)."""
    z = _unit(x)
    if z.shape[0] > max_points:
        z = z[torch.linspace(0, z.shape[0] - 1, max_points, device=z.device).long()]
    return torch.pdist(z, p=2).pow(2).mul(-t).exp().mean().log().item()


class CollapseStats(NamedTuple):
    effective_rank: float
    std: float  # per-dimension std of the L2-normalised features
    std_ratio: float  # std * sqrt(D): 1 for isotropic unit vectors, 0 for a collapse
    alignment: float
    uniformity: float
    dim: int

    def scalars(self, prefix: str = "knn/") -> dict[str, float]:
        """The values as metrics.json keys (``knn/effective_rank``, ...)."""
        names = ("effective_rank", "std", "std_ratio", "alignment", "uniformity")
        return {f"{prefix}{n}": float(getattr(self, n)) for n in names}


def collapse_stats(x: torch.Tensor, labels: torch.Tensor) -> CollapseStats:
    """All the diagnostics of ``x`` (N, D), ``labels`` (N,) saying the positive pairs."""
    std = feature_std(x)
    d = x.shape[1]
    return CollapseStats(
        effective_rank(x), std, std * math.sqrt(d), alignment(x, labels), uniformity(x), d
    )


def is_collapsed(stats: CollapseStats) -> bool:
    """Whether the effective rank or the per-dimension std is under its threshold."""
    return stats.effective_rank < MIN_EFFECTIVE_RANK or stats.std_ratio < MIN_STD_RATIO
