"""LORAC's contrastive loss with a low-rank prior (paper Eqs. 11-13, LORAC-bs Eq. 15).

Notation (paper Sec. 3): for instance i there are M-1 query embeddings q_{i,m} from the query
encoder f and one positive key k_i from the momentum encoder g; K negatives come from a queue.
The positive logit of query m is q_{i,m}.k_i / tau + log h(Q_i), where Q_i stacks the views that
enter the prior and the positive key(s) (M_Q rows). The loss of instance i is the mean over its
queries of the cross-entropy of [positive, negatives] (Eq. 12); the batch loss is the mean over
instances (Eq. 13).

Two faces, one implementation: :class:`LoracLoss` (built and validated once) and
:func:`lorac_loss`, over one multi-crop step (several key crops, one queue each, SwAV's pairing
of every view with every key crop but its own). The single-key loss of Eqs. (12)-(13) is the call
with one key crop: ``views`` (M, N, d) whose view 0 no query reads, ``keys`` (1, N, d),
``queues`` (1, K, d), ``key_views=[0]``.

Departures from the public reference code, on purpose (the paper is the specification):
  * every logit, the prior included, is divided by tau in every phase (the reference divides
    no logit by tau once the prior is on);
  * the prior carries the 1/M factor of Eq. (11) (the reference omits it);
  * beta follows the paper (2 on ImageNet-100 after the beta = inf warm-up; the reference: 15).

Choices where the paper is ambiguous, documented in docs/method.md:
  * Q_i (multi-crop) stacks instance i's large-view queries and *all* its keys, one Q per
    instance: 3 + 2 = 5 rows at 3x224 + 5x96, as the paper's constants imply (c0 = sqrt(5) is
    the minimum of ||Q||_* over 5 unit rows, Theorem 1); ``q_construction="per_key_crop"`` keeps
    the other reading (the large queries other than view j, plus k_j; 3 rows).
  * M in h(Q) is the number of rows of Q unless ``prior_m`` is given.
  * beta = inf disables every prior (MoCo-M), so the beta warm-up applies to the ablation priors
    too; ``gaussian`` ignores finite beta.
  * ``batchwise`` (LORAC-bs, Sec. 5, Eq. 15) centres the prior's queries (not the keys) over the
    global batch; its normaliser is the number of rows of P.
  * The logged accuracy compares the plain similarities q.k and q.k^- (without log h), so that it
    is comparable across the beta switch and between methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pretrain.losses.nuclear import NUCLEAR_NORM_METHODS, nuclear_norm
from pretrain.losses.priors import Prior, build_prior, prior_names

__all__ = [
    "LOWRANK_VIEW_SETS",
    "PRIORS",
    "Q_CONSTRUCTIONS",
    "LoracLoss",
    "LoracStats",
    "lorac_loss",
    "nuclear_norm",
    "resolve_lowrank_views",
    "take_views",
]

# The names ``prior`` accepts (those registered in pretrain.losses.priors.PRIOR_REGISTRY at import).
PRIORS: tuple[str, ...] = prior_names()
Q_CONSTRUCTIONS = ("instance", "per_key_crop")
# LOSS.LOWRANK_VIEWS: which views' queries enter Q (see resolve_lowrank_views).
LOWRANK_VIEW_SETS = ("large", "all", "queries")

_Check = Callable[[str, bool, str], None]


@dataclass(frozen=True)
class LoracStats:
    """Detached by-products of one loss evaluation, for logging."""

    # mean ||Q||_* (||P||_* for batchwise), also when the prior is off; None when not asked for
    nuclear_norm: torch.Tensor | None
    log_prior: torch.Tensor  # mean log h(Q), () float32
    # instance-discrimination top-1 over all (query, instance) pairs on the plain similarities
    # q.k vs q.k^- (log h left out, so that it is comparable across the beta switch), ()
    accuracy: torch.Tensor


def _view_indices(
    check: _Check, name: str, idx: Sequence[int], v: int | None, allow_empty: bool = False
) -> list[int]:
    """Checked view indices; the range check needs the number of views ``v`` (None: later)."""
    out = [int(i) for i in idx]
    check(name, allow_empty or len(out) > 0, "must name at least one view")
    check(
        name,
        all(i >= 0 and (v is None or i < v) for i in out),
        f"{out} out of range" + ("" if v is None else f" for {v} views"),
    )
    check(name, len(set(out)) == len(out), f"{out} repeats a view")
    return out


def resolve_lowrank_views(spec: str, num_views: int, num_large: int, num_keys: int) -> list[int]:
    """View indices of LOSS.LOWRANK_VIEWS: ``large`` (the large crops), ``all`` (every view) or
    ``queries`` (every view that is a query of some key crop: all but view 0 with one key crop)."""
    if spec == "large":
        return list(range(num_large))
    if spec == "all":
        return list(range(num_views))
    if spec == "queries":
        return [v for v in range(num_views) if num_keys > 1 or v != 0]
    raise ValueError(f"LOSS.LOWRANK_VIEWS = {spec!r}: expected one of {LOWRANK_VIEW_SETS}")


def take_views(x: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
    """``x[idx]`` along dim 0 from slices (a view for consecutive indices). No index tensor: a
    list index is copied to the device each call (a host sync), and a kept device index is state
    a compiled forward guards on."""
    idx = [int(i) for i in idx]
    if not idx:
        return x[:0]
    starts = [k for k, i in enumerate(idx) if k == 0 or i != idx[k - 1] + 1]
    runs = [idx[a:b] for a, b in zip(starts, [*starts[1:], len(idx)], strict=True)]
    parts = [x[r[0] : r[-1] + 1] for r in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _q_matrix(low: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Q per instance: the prior's query views stacked with the key(s). (N, L + J, d)"""
    return torch.cat([low, keys]).transpose(0, 1)


def _p_matrix(low: torch.Tensor) -> torch.Tensor:
    """P of Eq. (15): every instance's prior views centred on their mean. (N * L, d)"""
    centred = low - low.mean(0, keepdim=True)  # a_{i,m} = q_{i,m} - mu_i
    return centred.transpose(0, 1).reshape(-1, low.shape[-1])


class LoracLoss(nn.Module):
    """The LORAC objective of one multi-crop step (Eqs. 11-13; LORAC-bs Eq. 15); ``forward``
    returns ``(loss, LoracStats)``. ``beta`` may be set between calls (the beta schedule).

    Args:
        tau: temperature, > 0.
        beta: prior scale, > 0; ``math.inf`` switches every prior off (MoCo-M).
        prior: a :class:`~pretrain.losses.priors.Prior` or a registered name (then built with
            ``c``, ``c0``, ``sigma2``): ``laplace`` (Eq. 11, log h = -||Q||_*/(M beta tau)),
            ``gaussian`` (-(||Q||_* - c0)^2/(sigma2 M tau)), ``constant`` (-c/(M beta tau),
            L-sftmx-c), ``none`` (MoCo-M) or ``batchwise`` (LORAC-bs, Eq. 15, one prior shared
            by the batch).
        key_views: the J view indices the key crops were cut from (e.g. ``[0, 1]``).
        lowrank_views: the view indices whose queries enter the prior (e.g. the three large
            crops ``[0, 1, 2]``); may be empty when the prior never acts.
        c, c0, sigma2: the constants of priors ``constant`` and ``gaussian`` (a name only).
        prior_m: the M that normalises the prior (default: the number of rows of Q; for
            ``batchwise`` P has N * prior_m rows).
        q_construction: ``instance`` or ``per_key_crop`` (see the module docstring).
        nuclear_norm_method: the eigensolver of :func:`~pretrain.losses.nuclear.nuclear_norm`.

    For key crop j the queries are every view except ``key_views[j]``; loss_j is Eq. (13) with
    positive ``keys[j]`` and negatives ``queues[j]``; the result is the mean over j, in float32
    even under autocast.

    Raises:
        ValueError: on invalid hyperparameters or indices, naming the argument.
    """

    def __init__(
        self,
        *,
        tau: float,
        beta: float,
        prior: str | Prior = "laplace",
        key_views: Sequence[int] = (0,),
        lowrank_views: Sequence[int],
        c: float | None = None,
        c0: float | None = None,
        sigma2: float | None = None,
        prior_m: int | None = None,
        q_construction: str = "instance",
        nuclear_norm_method: str = "auto",
    ) -> None:
        super().__init__()
        check = self._check
        check(
            "tau",
            isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0,
            f"must be a finite number > 0, got {tau!r}",
        )
        self.beta = beta
        self.prior = self._resolve_prior(prior, c, c0, sigma2)
        self.tau = float(tau)
        self.key_views = tuple(_view_indices(check, "key_views", key_views, None))
        # a prior that never acts reads Q only for the logged ||Q||_*, which may be the keys alone
        self.lowrank_views = tuple(
            _view_indices(
                check, "lowrank_views", lowrank_views, None, allow_empty=not self.prior.enabled
            )
        )
        check(
            "q_construction",
            q_construction in Q_CONSTRUCTIONS,
            f"must be one of {Q_CONSTRUCTIONS}, got {q_construction!r}",
        )
        self.q_construction = q_construction
        check(
            "nuclear_norm_method",
            nuclear_norm_method in NUCLEAR_NORM_METHODS,
            f"must be one of {NUCLEAR_NORM_METHODS}, got {nuclear_norm_method!r}",
        )
        self.nuclear_norm_method = nuclear_norm_method
        self.prior_m = prior_m

    @classmethod
    def from_config(cls, cfg: Any, nuclear_norm_method: str | None = None) -> LoracLoss:
        """The loss of a pretraining config; ``nuclear_norm_method`` replaces
        LOSS.NUCLEAR_NORM (the model passes its "auto" resolved for the step)."""
        inp, loss = cfg.INPUT, cfg.LOSS
        num_views = inp.LARGE_CROPS + inp.SMALL_CROPS
        return cls(
            tau=loss.TAU,
            beta=float(loss.BETA),
            prior=build_prior(loss.PRIOR, c=loss.C, c0=loss.C0, sigma2=loss.SIGMA2),
            key_views=range(inp.KEY_CROPS),
            lowrank_views=resolve_lowrank_views(
                loss.LOWRANK_VIEWS, num_views, inp.LARGE_CROPS, inp.KEY_CROPS
            ),
            prior_m=loss.PRIOR_M or None,
            q_construction=loss.Q_CONSTRUCTION,
            nuclear_norm_method=nuclear_norm_method or loss.NUCLEAR_NORM,
        )

    def _check(self, name: str, ok: bool, msg: str) -> None:
        """ValueError("LoracLoss: <name> <msg>") unless ``ok``."""
        if not ok:
            raise ValueError(f"{type(self).__name__}: {name} {msg}")

    def _resolve_prior(
        self, prior: str | Prior, c: float | None, c0: float | None, sigma2: float | None
    ) -> Prior:
        """``prior`` itself, or the registered prior of that name built with c, c0, sigma2."""
        if isinstance(prior, Prior):
            given = (c, c0, sigma2) != (None, None, None)
            self._check(
                "prior", not given, "is a Prior instance, which holds its own c, c0, sigma2"
            )
            return prior
        self._check("prior", isinstance(prior, str), f"must be a name or a Prior, got {prior!r}")
        try:
            return build_prior(prior, c=c, c0=c0, sigma2=sigma2)
        except ValueError as e:  # its message starts with the argument's name
            raise ValueError(f"{type(self).__name__}: {e}") from None

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._check(
            "beta",
            isinstance(value, (int, float)) and value > 0 and not math.isnan(value),
            f"must be > 0 (inf disables the prior), got {value!r}",
        )
        self._beta = float(value)

    @property
    def q_rows(self) -> int:
        """Rows of each instance's Q (the M of h(Q) unless ``prior_m`` is set)."""
        if self.q_construction == "instance":
            return len(self.lowrank_views) + len(self.key_views)
        return len([v for v in self.lowrank_views if v != self.key_views[0]]) + 1

    def extra_repr(self) -> str:
        return (
            f"tau={self.tau}, beta={self.beta}, prior={self.prior}, key_views={self.key_views}, "
            f"lowrank_views={self.lowrank_views}, q_construction={self.q_construction!r}, "
            f"prior_m={self.prior_m}, nuclear_norm_method={self.nuclear_norm_method!r}"
        )

    def _check_shapes(
        self,
        views: torch.Tensor,
        keys: torch.Tensor,
        queues: torch.Tensor | None,
        global_lowrank: torch.Tensor | None,
    ) -> None:
        check = self._check
        check("views", views.dim() == 3, f"must be (V, N, d), got {tuple(views.shape)}")
        v, n, d = views.shape
        check("views", v >= 2, f"needs at least 2 views (a key crop and a query), got {v}")
        check("keys", keys.dim() == 3, f"must be (J, N, d), got {tuple(keys.shape)}")
        check(
            "keys", tuple(keys.shape[1:]) == (n, d), f"shape {tuple(keys.shape)} != (J, {n}, {d})"
        )
        j = keys.shape[0]
        check("keys", j >= 1, "needs at least one key crop")
        if queues is not None:
            check("queues", queues.dim() == 3, f"must be (J, K, d), got {tuple(queues.shape)}")
            check(
                "queues",
                queues.shape[0] == j and queues.shape[2] == d,
                f"shape {tuple(queues.shape)} != ({j}, K, {d})",
            )
        for name in ("key_views", "lowrank_views"):
            idx = list(getattr(self, name))
            check(name, all(i < v for i in idx), f"{idx} out of range for {v} views")
        check(
            "key_views",
            len(self.key_views) == j,
            f"has {len(self.key_views)} entries for {j} key crops",
        )
        if global_lowrank is not None:
            low = len(self.lowrank_views)
            check(
                "global_lowrank",
                global_lowrank.dim() == 3
                and global_lowrank.shape[0] == low
                and global_lowrank.shape[2] == d
                and global_lowrank.shape[1] >= n,
                f"must be ({low}, N_global >= {n}, {d}), got {tuple(global_lowrank.shape)}",
            )

    def _prior_terms(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        global_lowrank: torch.Tensor | None,
        log_norm: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log h (J, N) and the nuclear norm(s) it read, (N,) or () batchwise; None when
        neither the prior nor ``log_norm`` needs it (the norm costs a host sync on a GPU)."""
        prior, tau, prior_m = self.prior, self.tau, self.prior_m
        kv, low = self.key_views, list(self.lowrank_views)
        n = x.shape[1]
        # beta is read only where a prior is configured: a compiled step guards on the values it
        # reads (torch 2.11 on this one), and MoCo-M's must not recompile at the beta switch
        beta = self.beta if prior.enabled else math.inf
        prior_on = prior.active(beta)
        # log h grows a graph only when it is on and reads the norm; otherwise ||.||_* is logged
        grad_through_norm = torch.is_grad_enabled() and prior_on and prior.reads_norm
        if not (log_norm or prior_on):  # the norm would only be logged
            return x.new_zeros(len(kv), n), None
        if prior.batchwise:
            lowq = take_views(x, low) if global_lowrank is None else global_lowrank.float()
            p = _p_matrix(lowq)  # (N_global * L, d), Eq. (15)
            rows = p.shape[0] if prior_m is None else lowq.shape[1] * prior_m
            with torch.set_grad_enabled(grad_through_norm):
                nuc = nuclear_norm(p, self.nuclear_norm_method)
            if prior_on:
                lp = prior.log_h(nuc, rows, tau=tau, beta=beta).expand(len(kv), n)
            else:
                lp = x.new_zeros(len(kv), n)
            return lp, nuc.detach()
        if self.q_construction == "instance":
            q_mats = [_q_matrix(take_views(x, low), k)] * len(kv)  # (N, L + J, d)
        else:  # per_key_crop: the large queries other than view j, and k_j
            q_mats = [
                _q_matrix(take_views(x, [i for i in low if i != kv[j]]), k[j : j + 1])
                for j in range(len(kv))
            ]
        distinct = q_mats[:1] if self.q_construction == "instance" else q_mats
        with torch.set_grad_enabled(grad_through_norm):
            nucs = [nuclear_norm(q, self.nuclear_norm_method) for q in distinct]  # each (N,)
        if not prior_on:
            lp = x.new_zeros(len(kv), n)
        else:
            lps = [
                prior.log_h(nuc, q.shape[1] if prior_m is None else prior_m, tau=tau, beta=beta)
                for q, nuc in zip(distinct, nucs, strict=True)
            ]
            lp = torch.stack(lps).expand(len(kv), n)  # (J, N)
        return lp, torch.stack(nucs).detach().mean(0)

    def log_prior(
        self,
        views: torch.Tensor,
        keys: torch.Tensor,
        global_lowrank: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prior term alone: log h (J, N) (zeros while off) and the detached nuclear norm,
        (N,) or () batchwise; arguments as in :meth:`forward`."""
        self._check_shapes(views, keys, None, global_lowrank)
        with torch.autocast(device_type=views.device.type, enabled=False):
            lp, nuc = self._prior_terms(views.float(), keys.float(), global_lowrank)
        assert nuc is not None  # log_norm is on
        return lp, nuc

    def forward(
        self,
        views: torch.Tensor,
        keys: torch.Tensor,
        queues: torch.Tensor,
        global_lowrank: torch.Tensor | None = None,
        log_norm: bool = True,
    ) -> tuple[torch.Tensor, LoracStats]:
        """Loss and statistics of one step.

        Args:
            views: (V, N, d) L2-normalised query-encoder embeddings of every view (rows no term
                reads may hold anything).
            keys: (J, N, d) L2-normalised momentum-encoder embeddings of the J key crops.
            queues: (J, K, d) L2-normalised negatives, one queue per key crop.
            global_lowrank: for ``batchwise``, the (L, N_global, d) prior queries of the global
                batch (gathered with gradients), so that P spans it as Eq. (15) says.
            log_norm: compute ||Q||_* for the statistics even where the prior does not read it
                (the trainer turns it off between logging iterations).
        """
        self._check_shapes(views, keys, queues, global_lowrank)
        tau = self.tau
        with torch.autocast(device_type=views.device.type, enabled=False):
            x, k, queues = views.float(), keys.float(), queues.float()
            v = x.shape[0]
            lp, nucs = self._prior_terms(x, k, global_lowrank, log_norm)
            losses, correct = [], []
            for j, key_view in enumerate(self.key_views):
                # (V-1, N, d): SwAV's pairing
                q = take_views(x, [i for i in range(v) if i != key_view])
                sim_pos = torch.einsum("mnd,nd->mn", q, k[j]) / tau  # (V-1, N)
                l_pos = sim_pos + lp[j]
                l_neg = torch.matmul(q, queues[j].t()) / tau  # (V-1, N, K)
                # Eqs. (12)-(13) for key crop j; logaddexp avoids the (V-1, N, 1 + K) logits.
                losses.append((torch.logaddexp(l_pos, torch.logsumexp(l_neg, -1)) - l_pos).mean())
                with torch.no_grad():
                    if queues.shape[1]:
                        correct.append((sim_pos >= l_neg.amax(-1)).float().mean())
                    else:
                        correct.append(sim_pos.new_ones(()))
            loss = torch.stack(losses).mean()
            stats = LoracStats(
                nuclear_norm=None if nucs is None else nucs.mean(),
                log_prior=lp.detach().mean(),
                accuracy=torch.stack(correct).mean(),
            )
        return loss, stats


def lorac_loss(
    views: torch.Tensor,
    keys: torch.Tensor,
    queues: torch.Tensor,
    *,
    global_lowrank: torch.Tensor | None = None,
    **criterion: Any,
) -> torch.Tensor:
    """The scalar LORAC loss of one step: ``LoracLoss(**criterion)`` built and called once, on
    the tensors of :meth:`LoracLoss.forward`. With one key crop, one query and prior ``none`` it
    is InfoNCE, Eq. (1). Raises ValueError on invalid arguments, naming the argument.
    """
    # the statistics are dropped, so ||Q||_* is computed only where the prior reads it
    return LoracLoss(**criterion)(views, keys, queues, global_lowrank, log_norm=False)[0]
