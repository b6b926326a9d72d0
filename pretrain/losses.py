"""LORAC's contrastive loss with a low-rank prior (paper Eq. 11-14), as pure functions.

Notation (paper Sec. 3): for instance i there are M-1 query embeddings q_{i,m} from the query
encoder f and one positive key k_i from the momentum encoder g; K negatives come from a queue.
The positive logit of query m is q_{i,m}.k_i / tau + log h(Q_i), where Q_i stacks the queries that
enter the prior and the positive key (M_Q rows). The loss of instance i is the mean over its
queries of the cross-entropy of [positive, negatives] (Eq. 12); the batch loss is the mean over
instances (Eq. 13).

Departures from the public reference code, on purpose (the paper is the specification):
  * the prior is divided by tau in every phase (the reference drops 1/tau once the prior is on);
  * the prior carries the 1/M factor of Eq. (11) (the reference omits it);
  * Q_i is built from instance i's own views (the reference builds it from other rows).

Choices where the paper is silent, documented in docs/method.md:
  * M in h(Q) is the number of rows of Q (the paper's M when every query enters Q). Pass
    ``prior_m`` to normalise by another count (for example the total number of views).
  * beta = inf disables every prior (MoCo-M), including ``gaussian`` and ``constant``, so the
    beta warm-up schedule applies to the ablation priors too; ``gaussian`` ignores finite beta.
  * ``batchwise`` (LORAC-bs, Eq. 14) centres the queries that enter the prior (default: all of
    them; the key is left out because Eq. 14 centres views around the query mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pretrain.nuclear_norm import nuclear_norm

__all__ = ["PRIORS", "LoracStats", "lorac_loss", "lorac_loss_with_stats", "nuclear_norm"]

PRIORS = ("laplace", "gaussian", "constant", "none", "batchwise")


@dataclass(frozen=True)
class LoracStats:
    """Detached by-products of one loss evaluation, for logging."""

    nuclear_norm: torch.Tensor  # mean ||Q||_* (||P||_* for batchwise), also when the prior is off
    log_prior: torch.Tensor  # mean log h(Q), () float32
    accuracy: torch.Tensor  # instance-discrimination top-1 over all (query, instance) pairs, ()


def _check(name: str, ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(f"lorac_loss: {name} {msg}")


def _validate(queries, key, negatives, tau, beta, prior, c, c0, sigma2) -> None:
    _check("queries", queries.dim() == 3, f"must be (M-1, N, d), got {tuple(queries.shape)}")
    _check("queries", queries.shape[0] >= 1, "needs at least one query view")
    _check("key", key.dim() == 2, f"must be (N, d), got {tuple(key.shape)}")
    _check("negatives", negatives.dim() == 2, f"must be (K, d), got {tuple(negatives.shape)}")
    n, d = queries.shape[1:]
    _check("key", tuple(key.shape) == (n, d), f"shape {tuple(key.shape)} != (N, d) = {(n, d)}")
    _check("negatives", negatives.shape[1] == d, f"dim {negatives.shape[1]} != d = {d}")
    _check(
        "tau",
        isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0,
        f"must be a finite number > 0, got {tau!r}",
    )
    _check(
        "beta",
        isinstance(beta, (int, float)) and beta > 0 and not math.isnan(beta),
        f"must be > 0 (inf disables the prior), got {beta!r}",
    )
    _check("prior", prior in PRIORS, f"must be one of {PRIORS}, got {prior!r}")
    if prior == "constant":
        _check(
            "c", c is not None and math.isfinite(c), f"is required by prior 'constant', got {c!r}"
        )
    if prior == "gaussian":
        _check("c0", c0 is not None and math.isfinite(c0), f"is required by 'gaussian', got {c0!r}")
        _check(
            "sigma2",
            sigma2 is not None and sigma2 > 0,
            f"must be > 0 for 'gaussian', got {sigma2!r}",
        )


def _select(queries: torch.Tensor, lowrank_views: Sequence[int] | None) -> torch.Tensor:
    if lowrank_views is None:
        return queries
    idx = list(lowrank_views)
    m = queries.shape[0]
    _check("lowrank_views", len(idx) > 0, "must name at least one query view")
    _check("lowrank_views", all(-m <= i < m for i in idx), f"{idx} out of range for {m} queries")
    _check("lowrank_views", len({i % m for i in idx}) == len(idx), f"{idx} repeats a view")
    return queries[idx]


def _q_matrix(low: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Q per instance: the prior's query views stacked with the positive key. (N, M_Q, d)"""
    return torch.cat([low, key.unsqueeze(0)], 0).transpose(0, 1)


def _p_matrix(low: torch.Tensor) -> torch.Tensor:
    """P of Eq. (14): every instance's prior views centred on their mean. (N * M_l, d)"""
    centred = low - low.mean(0, keepdim=True)  # a_{i,m} = q_{i,m} - mu_i
    return centred.transpose(0, 1).reshape(-1, low.shape[-1])


def log_prior(
    queries: torch.Tensor,
    key: torch.Tensor,
    *,
    tau: float,
    beta: float,
    prior: str = "laplace",
    lowrank_views: Sequence[int] | None = None,
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log h(Q) per instance, (N,), and the nuclear norm it used, (N,) (zeros if unused).

    ``queries`` (M-1, N, d) and ``key`` (N, d) as in :func:`lorac_loss`; computed in float32.
    """
    queries, key = queries.float(), key.float()
    n = key.shape[0]
    zeros = key.new_zeros(n)
    if prior == "none" or math.isinf(beta):
        return zeros, zeros
    low = _select(queries, lowrank_views)  # (M_Q - 1, N, d)
    m_rows = low.shape[0] + 1 if prior_m is None else prior_m
    if prior == "constant":
        return zeros - c / (m_rows * beta * tau), zeros
    if prior == "batchwise":
        p = _p_matrix(low)  # (N * M_l, d)
        rows = p.shape[0] if prior_m is None else n * prior_m
        nuc = nuclear_norm(p)
        return (zeros - nuc / (rows * beta * tau)), zeros + nuc.detach()
    nuc = nuclear_norm(_q_matrix(low, key))  # (N,)
    if prior == "laplace":
        return -nuc / (m_rows * beta * tau), nuc.detach()
    # gaussian
    return -((nuc - c0) ** 2) / (sigma2 * m_rows * tau), nuc.detach()


def _logged_nuclear_norm(q, k, lowrank_views, prior) -> torch.Tensor:
    """Mean ||Q||_* (||P||_* for batchwise) for logging when the prior itself is off."""
    with torch.no_grad():
        low = _select(q, lowrank_views)
        if prior == "batchwise":
            return nuclear_norm(_p_matrix(low))
        return nuclear_norm(_q_matrix(low, k)).mean()


def lorac_loss_with_stats(
    queries: torch.Tensor,
    key: torch.Tensor,
    negatives: torch.Tensor,
    *,
    tau: float,
    beta: float,
    prior: str = "laplace",
    lowrank_views: Sequence[int] | None = None,
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
) -> tuple[torch.Tensor, LoracStats]:
    """:func:`lorac_loss` plus detached statistics for logging."""
    _validate(queries, key, negatives, tau, beta, prior, c, c0, sigma2)
    # The loss and the prior are computed in float32 even under autocast.
    with torch.autocast(device_type=queries.device.type, enabled=False):
        q, k, neg = queries.float(), key.float(), negatives.float()
        lp, nuc = log_prior(
            q,
            k,
            tau=tau,
            beta=beta,
            prior=prior,
            lowrank_views=lowrank_views,
            c=c,
            c0=c0,
            sigma2=sigma2,
            prior_m=prior_m,
        )
        l_pos = torch.einsum("mnd,nd->mn", q, k) / tau + lp  # (M-1, N)
        l_neg = torch.matmul(q, neg.t()) / tau  # (M-1, N, K)
        # -log softmax([l_pos, l_neg])[0], averaged over queries (Eq. 12) then instances (Eq. 13);
        # logaddexp avoids materialising the (M-1, N, 1 + K) logits.
        loss = (torch.logaddexp(l_pos, torch.logsumexp(l_neg, -1)) - l_pos).mean()
        with torch.no_grad():
            acc = (l_pos >= l_neg.amax(-1)).float().mean() if neg.shape[0] else None
            prior_off = prior in ("none", "constant") or math.isinf(beta)
            logged = _logged_nuclear_norm(q, k, lowrank_views, prior) if prior_off else nuc.mean()
            stats = LoracStats(
                nuclear_norm=logged,
                log_prior=lp.detach().mean(),
                accuracy=acc if acc is not None else l_pos.new_ones(()),
            )
    return loss, stats


def lorac_loss(
    queries: torch.Tensor,
    key: torch.Tensor,
    negatives: torch.Tensor,
    *,
    tau: float,
    beta: float,
    prior: str = "laplace",
    lowrank_views: Sequence[int] | None = None,
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
) -> torch.Tensor:
    """LORAC loss, Eq. (12)-(13), averaged over the batch.

    Args:
        queries: (M-1, N, d) L2-normalised query embeddings (gradients flow through them).
        key: (N, d) L2-normalised positive keys (normally detached momentum-encoder outputs).
        negatives: (K, d) L2-normalised negative keys (the queue).
        tau: temperature, > 0.
        beta: prior scale, > 0; ``math.inf`` disables the prior (MoCo-M).
        prior: ``laplace`` (Eq. 11, log h = -||Q||_*/(M beta tau)), ``gaussian``
            (-(||Q||_* - c0)^2/(sigma2 M tau)), ``constant`` (-c/(M beta tau), L-sftmx-c),
            ``none`` (MoCo-M) or ``batchwise`` (LORAC-bs, Eq. 14, one prior shared by the batch).
        lowrank_views: indices into ``queries`` of the views that enter Q (default: all).
        c: the constant of prior ``constant``.
        c0, sigma2: centre and variance of prior ``gaussian``.
        prior_m: the M that normalises the prior (default: the number of rows of Q).

    Returns:
        Scalar float32 loss. With one query and prior ``none`` it is InfoNCE, Eq. (1).

    Raises:
        ValueError: on inconsistent shapes or invalid hyperparameters, naming the argument.
    """
    loss, _ = lorac_loss_with_stats(
        queries,
        key,
        negatives,
        tau=tau,
        beta=beta,
        prior=prior,
        lowrank_views=lowrank_views,
        c=c,
        c0=c0,
        sigma2=sigma2,
        prior_m=prior_m,
    )
    return loss


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Row-wise L2 normalisation in float32 (embeddings enter the loss normalised)."""
    return F.normalize(x.float(), dim=-1)
