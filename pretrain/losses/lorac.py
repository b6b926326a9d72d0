"""LORAC's contrastive loss with a low-rank prior (paper Eq. 11-14), as pure functions.

Notation (paper Sec. 3): for instance i there are M-1 query embeddings q_{i,m} from the query
encoder f and one positive key k_i from the momentum encoder g; K negatives come from a queue.
The positive logit of query m is q_{i,m}.k_i / tau + log h(Q_i), where Q_i stacks the views that
enter the prior and the positive key(s) (M_Q rows). The loss of instance i is the mean over its
queries of the cross-entropy of [positive, negatives] (Eq. 12); the batch loss is the mean over
instances (Eq. 13).

:func:`multicrop_lorac_loss` is the whole objective of one multi-crop step (several key crops,
one queue each, SwAV's pairing of every view with every key crop but its own); :func:`lorac_loss`
is the single-key case of Eq. (12)-(13).

Departures from the public reference code, on purpose (the paper is the specification):
  * every logit, the prior included, is divided by tau in every phase (the reference divides
    no logit by tau once the prior is on);
  * the prior carries the 1/M factor of Eq. (11) (the reference omits it);
  * beta follows the paper (2 on ImageNet-100 after the beta = inf warm-up; the reference: 15).

Choices where the paper is ambiguous, documented in docs/method.md:
  * Q_i (multi-crop) stacks instance i's large-view queries and *all* its keys, one Q per
    instance shared by every key crop: 3 + 2 = 5 rows at 3x224 + 5x96, which is what the paper's
    constants imply (c0 = sqrt(5) is the minimum of ||Q||_* over 5 unit rows, Theorem 1).
    ``q_construction="per_key_crop"`` keeps the other reading (for key crop j: the large queries
    other than view j, plus k_j; 3 rows) for comparison.
  * M in h(Q) is the number of rows of Q unless ``prior_m`` is given.
  * The priors (log h as a function of a nuclear norm) are the classes of
  :mod:`pretrain.losses.priors`,
    named through its registry; the functions here build Q (or P), take its nuclear norm (this
    module's ``nuclear_norm``) and hand it to the prior.
  * beta = inf disables every prior (MoCo-M), including ``gaussian`` and ``constant``, so the
    beta warm-up schedule applies to the ablation priors too; ``gaussian`` ignores finite beta.
  * ``batchwise`` (LORAC-bs, Eq. 14) centres the queries that enter the prior (the keys are left
    out: Eq. 14 centres views around the query mean) over the whole (global) batch; its
    normaliser is the number of rows of P.
  * The logged instance-discrimination accuracy compares the plain similarities q.k and q.k^-
    (without log h), so that it is comparable across the beta switch and between methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pretrain.losses.nuclear import nuclear_norm
from pretrain.losses.priors import Prior, build_prior, prior_names

__all__ = [
    "PRIORS",
    "Q_CONSTRUCTIONS",
    "LoracStats",
    "log_prior",
    "lorac_loss",
    "lorac_loss_with_stats",
    "multicrop_lorac_loss",
    "multicrop_lorac_loss_with_stats",
    "nuclear_norm",
]

# The names ``prior`` accepts (those registered in pretrain.losses.priors.PRIOR_REGISTRY at import).
PRIORS: tuple[str, ...] = prior_names()
Q_CONSTRUCTIONS = ("instance", "per_key_crop")

_Check = Callable[[str, bool, str], None]


@dataclass(frozen=True)
class LoracStats:
    """Detached by-products of one loss evaluation, for logging."""

    nuclear_norm: torch.Tensor  # mean ||Q||_* (||P||_* for batchwise), also when the prior is off
    log_prior: torch.Tensor  # mean log h(Q), () float32
    # instance-discrimination top-1 over all (query, instance) pairs on the plain similarities
    # q.k vs q.k^- (log h left out, so that it is comparable across the beta switch), ()
    accuracy: torch.Tensor


def _checker(function: str) -> _Check:
    """``check(name, ok, msg)``: ValueError("<function>: <name> <msg>") unless ``ok``."""

    def check(name: str, ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(f"{function}: {name} {msg}")

    return check


_check = _checker("lorac_loss")


def _resolve_prior(
    prior: str | Prior, c: float | None, c0: float | None, sigma2: float | None, function: str
) -> Prior:
    """``prior`` itself, or the registered prior of that name built with c, c0, sigma2."""
    check = _checker(function)
    if isinstance(prior, Prior):
        given = (c, c0, sigma2) != (None, None, None)
        check("prior", not given, "is a Prior instance, which holds its own c, c0, sigma2")
        return prior
    check("prior", isinstance(prior, str), f"must be a name or a Prior, got {prior!r}")
    try:
        return build_prior(prior, c=c, c0=c0, sigma2=sigma2)
    except ValueError as e:  # its message starts with the argument's name
        raise ValueError(f"{function}: {e}") from None


def _validate_hparams(
    tau: float,
    beta: float,
    prior: str | Prior,
    c: float | None,
    c0: float | None,
    sigma2: float | None,
    function: str = "lorac_loss",
) -> Prior:
    """Checks tau and beta; returns the Prior object of ``prior``."""
    check = _checker(function)
    check(
        "tau",
        isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0,
        f"must be a finite number > 0, got {tau!r}",
    )
    check(
        "beta",
        isinstance(beta, (int, float)) and beta > 0 and not math.isnan(beta),
        f"must be > 0 (inf disables the prior), got {beta!r}",
    )
    return _resolve_prior(prior, c, c0, sigma2, function)


def _validate(
    queries: torch.Tensor,
    key: torch.Tensor,
    negatives: torch.Tensor,
    tau: float,
    beta: float,
    prior: str | Prior,
    c: float | None,
    c0: float | None,
    sigma2: float | None,
) -> Prior:
    _check("queries", queries.dim() == 3, f"must be (M-1, N, d), got {tuple(queries.shape)}")
    _check("queries", queries.shape[0] >= 1, "needs at least one query view")
    _check("key", key.dim() == 2, f"must be (N, d), got {tuple(key.shape)}")
    _check("negatives", negatives.dim() == 2, f"must be (K, d), got {tuple(negatives.shape)}")
    n, d = queries.shape[1:]
    _check("key", tuple(key.shape) == (n, d), f"shape {tuple(key.shape)} != (N, d) = {(n, d)}")
    _check("negatives", negatives.shape[1] == d, f"dim {negatives.shape[1]} != d = {d}")
    return _validate_hparams(tau, beta, prior, c, c0, sigma2)


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
    prior: str | Prior = "laplace",
    lowrank_views: Sequence[int] | None = None,
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log h(Q) per instance, (N,), and the nuclear norm it used, (N,) (zeros if unused).

    ``queries`` (M-1, N, d) and ``key`` (N, d) as in :func:`lorac_loss`; computed in float32.
    """
    prior = _resolve_prior(prior, c, c0, sigma2, "log_prior")
    queries, key = queries.float(), key.float()
    n = key.shape[0]
    zeros = key.new_zeros(n)
    if not prior.active(beta):
        return zeros, zeros
    low = _select(queries, lowrank_views)  # (M_Q - 1, N, d)
    if prior.batchwise:
        p = _p_matrix(low)  # (N * M_l, d)
        rows = p.shape[0] if prior_m is None else n * prior_m
        nuc = nuclear_norm(p)
        return zeros + prior.log_h(nuc, rows, tau=tau, beta=beta), zeros + nuc.detach()
    m_rows = low.shape[0] + 1 if prior_m is None else prior_m
    if not prior.reads_norm:  # e.g. constant: no norm to compute
        return prior.log_h(zeros, m_rows, tau=tau, beta=beta), zeros
    nuc = nuclear_norm(_q_matrix(low, key))  # (N,)
    return prior.log_h(nuc, m_rows, tau=tau, beta=beta), nuc.detach()


def _logged_nuclear_norm(
    q: torch.Tensor, k: torch.Tensor, lowrank_views: Sequence[int] | None, batchwise: bool
) -> torch.Tensor:
    """Mean ||Q||_* (||P||_* for a batchwise prior) for logging when the prior itself is off."""
    with torch.no_grad():
        low = _select(q, lowrank_views)
        if batchwise:
            return nuclear_norm(_p_matrix(low))
        return nuclear_norm(_q_matrix(low, k)).mean()


def lorac_loss_with_stats(
    queries: torch.Tensor,
    key: torch.Tensor,
    negatives: torch.Tensor,
    *,
    tau: float,
    beta: float,
    prior: str | Prior = "laplace",
    lowrank_views: Sequence[int] | None = None,
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
) -> tuple[torch.Tensor, LoracStats]:
    """:func:`lorac_loss` plus detached statistics for logging."""
    prior = _validate(queries, key, negatives, tau, beta, prior, c, c0, sigma2)
    # The loss and the prior are computed in float32 even under autocast.
    with torch.autocast(device_type=queries.device.type, enabled=False):
        q, k, neg = queries.float(), key.float(), negatives.float()
        lp, nuc = log_prior(
            q, k, tau=tau, beta=beta, prior=prior, lowrank_views=lowrank_views, prior_m=prior_m
        )
        l_pos = torch.einsum("mnd,nd->mn", q, k) / tau + lp  # (M-1, N)
        l_neg = torch.matmul(q, neg.t()) / tau  # (M-1, N, K)
        # -log softmax([l_pos, l_neg])[0], averaged over queries (Eq. 12) then instances (Eq. 13);
        # logaddexp avoids materialising the (M-1, N, 1 + K) logits.
        loss = (torch.logaddexp(l_pos, torch.logsumexp(l_neg, -1)) - l_pos).mean()
        with torch.no_grad():
            # plain similarities: the prior's margin alone must not move the logged accuracy
            sim_pos = l_pos - lp
            acc = (sim_pos >= l_neg.amax(-1)).float().mean() if neg.shape[0] else None
            if prior.active(beta) and prior.reads_norm:
                logged = nuc.mean()
            else:
                logged = _logged_nuclear_norm(q, k, lowrank_views, prior.batchwise)
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
    prior: str | Prior = "laplace",
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
        prior: a :class:`~pretrain.losses.priors.Prior`, or the name of a registered one (then built
            with ``c``, ``c0``, ``sigma2``): ``laplace`` (Eq. 11, log h = -||Q||_*/(M beta tau)),
            ``gaussian`` (-(||Q||_* - c0)^2/(sigma2 M tau)), ``constant`` (-c/(M beta tau),
            L-sftmx-c), ``none`` (MoCo-M) or ``batchwise`` (LORAC-bs, Eq. 14, one prior shared
            by the batch).
        lowrank_views: indices into ``queries`` of the views that enter Q (default: all).
        c: the constant of prior ``constant`` (a name only).
        c0, sigma2: centre and variance of prior ``gaussian`` (a name only).
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


def _view_indices(
    check: _Check, name: str, idx: Sequence[int], v: int, allow_empty: bool = False
) -> list[int]:
    out = [int(i) for i in idx]
    check(name, allow_empty or len(out) > 0, "must name at least one view")
    check(name, all(0 <= i < v for i in out), f"{out} out of range for {v} views")
    check(name, len(set(out)) == len(out), f"{out} repeats a view")
    return out


def _validate_multicrop(
    views: torch.Tensor,
    keys: torch.Tensor,
    queues: torch.Tensor,
    key_views: Sequence[int],
    lowrank_views: Sequence[int],
    q_construction: str,
    global_lowrank: torch.Tensor | None,
    prior: Prior,
) -> tuple[list[int], list[int]]:
    check = _checker("multicrop_lorac_loss")
    check("views", views.dim() == 3, f"must be (V, N, d), got {tuple(views.shape)}")
    v, n, d = views.shape
    check("views", v >= 2, f"needs at least 2 views (a key crop and a query), got {v}")
    check("keys", keys.dim() == 3, f"must be (J, N, d), got {tuple(keys.shape)}")
    check("keys", tuple(keys.shape[1:]) == (n, d), f"shape {tuple(keys.shape)} != (J, {n}, {d})")
    j = keys.shape[0]
    check("keys", j >= 1, "needs at least one key crop")
    check("queues", queues.dim() == 3, f"must be (J, K, d), got {tuple(queues.shape)}")
    check(
        "queues",
        queues.shape[0] == j and queues.shape[2] == d,
        f"shape {tuple(queues.shape)} != ({j}, K, {d})",
    )
    kv = _view_indices(check, "key_views", key_views, v)
    # a prior that never acts reads Q only for the logged ||Q||_*, which may be the keys alone
    low = _view_indices(check, "lowrank_views", lowrank_views, v, allow_empty=not prior.enabled)
    check("key_views", len(kv) == j, f"has {len(kv)} entries for {j} key crops")
    check(
        "q_construction",
        q_construction in Q_CONSTRUCTIONS,
        f"must be one of {Q_CONSTRUCTIONS}, got {q_construction!r}",
    )
    if global_lowrank is not None:
        check(
            "global_lowrank",
            global_lowrank.dim() == 3
            and global_lowrank.shape[0] == len(low)
            and global_lowrank.shape[2] == d
            and global_lowrank.shape[1] >= n,
            f"must be ({len(low)}, N_global >= {n}, {d}), got {tuple(global_lowrank.shape)}",
        )
    return kv, low


def multicrop_lorac_loss_with_stats(
    views: torch.Tensor,
    keys: torch.Tensor,
    queues: torch.Tensor,
    *,
    key_views: Sequence[int],
    lowrank_views: Sequence[int],
    tau: float,
    beta: float,
    prior: str | Prior = "laplace",
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
    q_construction: str = "instance",
    global_lowrank: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LoracStats]:
    """:func:`multicrop_lorac_loss` plus detached statistics for logging."""
    prior = _validate_hparams(tau, beta, prior, c, c0, sigma2, "multicrop_lorac_loss")
    kv, low = _validate_multicrop(
        views, keys, queues, key_views, lowrank_views, q_construction, global_lowrank, prior
    )
    with torch.autocast(device_type=views.device.type, enabled=False):
        x, k, queues = views.float(), keys.float(), queues.float()
        v, n, _ = x.shape
        prior_on = prior.active(beta)
        # log h grows a graph only when it is on and reads the norm; otherwise ||.||_* is logged
        grad_through_norm = torch.is_grad_enabled() and prior_on and prior.reads_norm
        # The prior of each key crop, (J, N) log h, and the nuclear norms it used (for logging).
        if prior.batchwise:
            lowq = x[low] if global_lowrank is None else global_lowrank.float()
            p = _p_matrix(lowq)  # (N_global * L, d), Eq. (14)
            rows = p.shape[0] if prior_m is None else lowq.shape[1] * prior_m
            with torch.set_grad_enabled(grad_through_norm):
                nuc = nuclear_norm(p)
            if prior_on:
                lp = prior.log_h(nuc, rows, tau=tau, beta=beta).expand(len(kv), n)
            else:
                lp = x.new_zeros(len(kv), n)
            logged_nuc = nuc.detach()
        else:
            if q_construction == "instance":
                q_mats = [torch.cat([x[low], k]).transpose(0, 1)] * len(kv)  # (N, L + J, d)
            else:  # per_key_crop: the large queries other than view j, and k_j
                q_mats = [
                    torch.cat([x[[i for i in low if i != kv[j]]], k[j : j + 1]]).transpose(0, 1)
                    for j in range(len(kv))
                ]
            distinct = q_mats[:1] if q_construction == "instance" else q_mats
            with torch.set_grad_enabled(grad_through_norm):
                nucs = [nuclear_norm(q) for q in distinct]  # each (N,)
            logged_nuc = torch.stack(nucs).detach().mean()
            if not prior_on:
                lp = x.new_zeros(len(kv), n)
            else:
                lps = [
                    prior.log_h(nuc, q.shape[1] if prior_m is None else prior_m, tau=tau, beta=beta)
                    for q, nuc in zip(distinct, nucs, strict=True)
                ]
                lp = torch.stack(lps).expand(len(kv), n)  # (J, N)
        losses, correct = [], []
        for j, key_view in enumerate(kv):
            q = x[[i for i in range(v) if i != key_view]]  # (V-1, N, d): SwAV's pairing
            sim_pos = torch.einsum("mnd,nd->mn", q, k[j]) / tau  # (V-1, N)
            l_pos = sim_pos + lp[j]
            l_neg = torch.matmul(q, queues[j].t()) / tau  # (V-1, N, K)
            # Eq. (12)-(13) for key crop j; logaddexp avoids the (V-1, N, 1 + K) logits.
            losses.append((torch.logaddexp(l_pos, torch.logsumexp(l_neg, -1)) - l_pos).mean())
            with torch.no_grad():
                if queues.shape[1]:
                    correct.append((sim_pos >= l_neg.amax(-1)).float().mean())
                else:
                    correct.append(sim_pos.new_ones(()))
        loss = torch.stack(losses).mean()
        stats = LoracStats(
            nuclear_norm=logged_nuc.mean(),
            log_prior=lp.detach().mean(),
            accuracy=torch.stack(correct).mean(),
        )
    return loss, stats


def multicrop_lorac_loss(
    views: torch.Tensor,
    keys: torch.Tensor,
    queues: torch.Tensor,
    *,
    key_views: Sequence[int],
    lowrank_views: Sequence[int],
    tau: float,
    beta: float,
    prior: str | Prior = "laplace",
    c: float | None = None,
    c0: float | None = None,
    sigma2: float | None = None,
    prior_m: int | None = None,
    q_construction: str = "instance",
    global_lowrank: torch.Tensor | None = None,
) -> torch.Tensor:
    """The whole LORAC objective of one multi-crop step (Eq. 11-14, Sec. 5.1).

    Args:
        views: (V, N, d) L2-normalised query-encoder embeddings of every view. Rows that the
            objective never reads (a key crop's own view, when it is no other key crop's query
            and not in ``lowrank_views``) may hold anything, e.g. zeros when f skipped them.
        keys: (J, N, d) L2-normalised momentum-encoder embeddings of the J key crops.
        queues: (J, K, d) L2-normalised negatives, one queue per key crop.
        key_views: the J view indices the key crops were cut from (e.g. ``[0, 1]``).
        lowrank_views: the view indices whose queries enter the prior (e.g. the three large
            crops ``[0, 1, 2]``).
        tau: temperature, > 0.
        beta: prior scale, > 0; ``math.inf`` switches every prior off (MoCo-M).
        prior: a :class:`~pretrain.losses.priors.Prior` or a registered name: ``laplace`` (Eq. 11),
            ``gaussian``, ``constant`` (L-sftmx-c), ``none`` (MoCo-M) or ``batchwise``
            (LORAC-bs, Eq. 14); see :func:`lorac_loss`.
        c, c0, sigma2: the constants of priors ``constant`` and ``gaussian`` (a name only).
        prior_m: the M that normalises the prior (default: the number of rows of Q; for
            ``batchwise`` P has N * prior_m rows).
        q_construction: ``instance``: Q_i stacks ``views[lowrank_views, i]`` and all J keys
            ``keys[:, i]``, one Q per instance shared by every key crop (the paper's reading,
            5 rows at 3x224 + 5x96); ``per_key_crop``: for key crop j, Q_i^j stacks the
            lowrank views other than ``key_views[j]`` and ``keys[j, i]`` (3 rows there).
        global_lowrank: for ``batchwise``, the (L, N_global, d) ``lowrank_views`` queries of
            every instance of the global batch (gathered with gradients), so that P is shared
            across the whole batch as Eq. (14) says; default: this call's own instances.

    For key crop j the queries are every view except ``key_views[j]`` (SwAV's pairing); loss_j
    is Eq. (13) over those V-1 queries with positive ``keys[j]`` and negatives ``queues[j]``,
    and the result is the mean over j. Computed in float32 even under autocast.

    Raises:
        ValueError: on inconsistent shapes, indices or hyperparameters, naming the argument.
    """
    loss, _ = multicrop_lorac_loss_with_stats(
        views,
        keys,
        queues,
        key_views=key_views,
        lowrank_views=lowrank_views,
        tau=tau,
        beta=beta,
        prior=prior,
        c=c,
        c0=c0,
        sigma2=sigma2,
        prior_m=prior_m,
        q_construction=q_construction,
        global_lowrank=global_lowrank,
    )
    return loss
