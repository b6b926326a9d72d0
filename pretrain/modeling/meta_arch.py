"""Multi-view momentum contrast: LORAC, MoCo-M and MoCo-v2 in one model (paper Sec. 3, Alg. 1).

Per iteration, each image gives V views (multi-crop 3x224 + 5x96 for LORAC/MoCo-M; two 224 views
for MoCo-v2). Every view goes through the query encoder f. The first J large crops are key crops:
each goes through the momentum encoder g (with ShuffleBN) and has its own queue of K negatives.
For key crop j, all other V-1 views are its queries and the loss is Eq. (12)-(13) with the prior
h(Q) (Q: the query views selected by LOSS.LOWRANK_VIEWS plus the positive key). The total loss is
the mean over key crops. MoCo-M is the same model with prior "none" (or beta = inf); MoCo-v2 is
two 224 views (MoCo-v2 scale and jitter), one key crop, prior "none".
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict

import torch
from torch import nn

from pretrain.data.sampler import sample_seed
from pretrain.losses import lorac_loss_with_stats
from pretrain.modeling.build import META_ARCH_REGISTRY
from pretrain.modeling.distributed import concat_all_gather, rank, world_size
from pretrain.modeling.encoder import Encoder, convert_norm

__all__ = ["MultiViewMoCo"]


@META_ARCH_REGISTRY.register()
class MultiViewMoCo(nn.Module):
    def __init__(
        self,
        *,
        arch: str,
        hidden_dim: int,
        out_dim: int,
        view_sizes: list[int],
        num_key_crops: int,
        num_large: int,
        queue_size: int,
        momentum: float,
        tau: float,
        beta: float,
        prior: str,
        lowrank_views: str,
        prior_kwargs: dict,
        prior_m: int,
        shuffle_bn: bool,
        key_bn_splits: int,
        norm: str,
        color_augment,
        color_on_device: bool,
        channels_last: bool,
        seed: int,
    ):
        super().__init__()
        self.encoder_q = Encoder(arch, hidden_dim, out_dim)
        self.encoder_k = copy.deepcopy(self.encoder_q)  # plain BN: ShuffleBN handles leakage
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.encoder_q = convert_norm(self.encoder_q, norm)
        self.view_sizes, self.num_key_crops, self.num_large = view_sizes, num_key_crops, num_large
        self.momentum, self.tau, self.beta = momentum, tau, beta
        self.prior, self.prior_kwargs, self.prior_m = prior, prior_kwargs, prior_m
        self.lowrank_views = lowrank_views
        self.shuffle_bn, self.key_bn_splits = shuffle_bn, key_bn_splits
        self.color_augment, self.color_on_device = color_augment, color_on_device
        self.channels_last, self.seed = channels_last, seed
        queues = nn.functional.normalize(torch.randn(num_key_crops, queue_size, out_dim), dim=-1)
        self.register_buffer("queues", queues)  # (J, K, d)
        self.register_buffer("queue_ptr", torch.zeros(num_key_crops, dtype=torch.long))
        if channels_last:
            self.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(cls, cfg, world_size: int = 1) -> dict:
        from pretrain.data.color import BatchColorAugment
        from pretrain.data.loader import build_train_transform

        inp, loss, mod = cfg.INPUT, cfg.LOSS, cfg.MODEL
        sizes = [inp.LARGE_SIZE] * inp.LARGE_CROPS + [inp.SMALL_SIZE] * inp.SMALL_CROPS
        norm = mod.NORM
        if world_size == 1:
            norm = "BN"
        elif norm == "auto":
            norm = "SyncBN" if mod.DEVICE == "cuda" else "NaiveSyncBN"
        _, color = build_train_transform(cfg)
        return {
            "arch": mod.ARCH,
            "hidden_dim": mod.HEAD_HIDDEN_DIM,
            "out_dim": mod.HEAD_OUT_DIM,
            "view_sizes": sizes,
            "num_key_crops": inp.KEY_CROPS,
            "num_large": inp.LARGE_CROPS,
            "queue_size": mod.QUEUE_SIZE,
            "momentum": mod.MOMENTUM,
            "tau": loss.TAU,
            "beta": float(loss.BETA),
            "prior": loss.PRIOR,
            "lowrank_views": loss.LOWRANK_VIEWS,
            "prior_kwargs": {"c": loss.C, "c0": loss.C0, "sigma2": loss.SIGMA2},
            "prior_m": loss.PRIOR_M,
            "shuffle_bn": mod.SHUFFLE_BN,
            "key_bn_splits": mod.KEY_BN_SPLITS,
            "norm": norm,
            "color_augment": BatchColorAugment(color),
            "color_on_device": inp.COLOR_ON_DEVICE,
            "channels_last": mod.CHANNELS_LAST,
            "seed": cfg.SEED,
        }

    # -- hooks' entry points -------------------------------------------------------------
    def set_beta(self, beta: float) -> None:
        """Set the prior's beta (math.inf switches the prior off: MoCo-M)."""
        self.beta = float(beta)

    @torch.no_grad()
    def momentum_update(self) -> None:
        """theta_k <- m theta_k + (1 - m) theta_q (parameters only, as in MoCo)."""
        k = [p for p in self.encoder_k.parameters()]
        q = [p.detach() for p in self.encoder_q.parameters()]
        torch._foreach_lerp_(k, q, 1.0 - self.momentum)

    # -- forward -------------------------------------------------------------------------
    def _prepare(self, batch: dict) -> list[torch.Tensor]:
        device = self.queues.device
        views = [v.to(device, non_blocking=True) for v in batch["views"]]
        if len(views) != len(self.view_sizes):
            raise ValueError(f"expected {len(self.view_sizes)} views, got {len(views)}")
        apply = self.color_on_device and self.training
        params = batch.get("color_params") if apply else None
        # Without per-sample parameters from the loader, draw them from the batch's first seed.
        g = torch.Generator().manual_seed(int(batch["seeds"][0]) & 0xFFFFFFFFFFFF)
        views = self.color_augment(views, g, apply_color=apply, params=params)
        if self.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    def _encode_queries(self, views: list[torch.Tensor]) -> list[torch.Tensor]:
        """f on every view, one forward per resolution (BN statistics over same-size crops)."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, v in enumerate(views):
            groups[tuple(v.shape[-2:])].append(i)
        out: list[torch.Tensor] = [None] * len(views)  # type: ignore[list-item]
        for idx in groups.values():
            emb = self.encoder_q(torch.cat([views[i] for i in idx]))
            for i, e in zip(idx, emb.chunk(len(idx)), strict=True):
                out[i] = e
        return out

    @torch.no_grad()
    def _encode_keys(self, x: torch.Tensor, iteration: int, crop: int) -> torch.Tensor:
        """g(x) with ShuffleBN; returns the keys of the whole global batch, in batch order.

        The global batch is permuted with a seed shared by all processes, each process encodes
        its slice in ``key_bn_splits`` BN groups, and the keys are gathered and un-permuted.
        With one process and one split this is a plain forward (BN is permutation invariant).
        """
        n_proc, b = world_size(), x.shape[0]
        groups = n_proc * self.key_bn_splits
        if not self.shuffle_bn or groups == 1:
            return concat_all_gather(self.encoder_k(x))
        x_all = concat_all_gather(x)
        g = torch.Generator().manual_seed(sample_seed(self.seed, iteration, -2 - crop) >> 16)
        perm = torch.randperm(x_all.shape[0], generator=g).to(x.device)
        mine = x_all[perm[rank() * b : (rank() + 1) * b]]
        k_mine = torch.cat([self.encoder_k(c) for c in mine.chunk(self.key_bn_splits)])
        k_perm = concat_all_gather(k_mine)
        keys = torch.empty_like(k_perm)
        keys[perm] = k_perm
        return keys

    def _lowrank_indices(self, key_crop: int) -> list[int] | None:
        if self.lowrank_views == "all":
            return None
        others = [v for v in range(len(self.view_sizes)) if v != key_crop]
        return [i for i, v in enumerate(others) if v < self.num_large]

    @torch.no_grad()
    def _enqueue(self, crop: int, keys: torch.Tensor) -> None:
        k = self.queues.shape[1]
        ptr = int(self.queue_ptr[crop])
        n = keys.shape[0]
        if k % n:
            raise ValueError(f"MODEL.QUEUE_SIZE {k} is not divisible by the global batch {n}")
        self.queues[crop, ptr : ptr + n] = keys.to(self.queues.dtype)
        self.queue_ptr[crop] = (ptr + n) % k

    def forward(self, batch: dict) -> dict:
        views = self._prepare(batch)
        b = views[0].shape[0]
        iteration = int(batch.get("iteration", 0))
        queries = self._encode_queries(views)
        global_keys = [self._encode_keys(views[j], iteration, j) for j in range(self.num_key_crops)]
        r = rank()
        losses, nuc, acc = [], [], []
        for j in range(self.num_key_crops):
            key = global_keys[j][r * b : (r + 1) * b]
            q = torch.stack([queries[v] for v in range(len(views)) if v != j])  # (V-1, B, d)
            loss, stats = lorac_loss_with_stats(
                q,
                key,
                self.queues[j].clone().detach(),
                tau=self.tau,
                beta=self.beta,
                prior=self.prior,
                lowrank_views=self._lowrank_indices(j),
                prior_m=self.prior_m or None,
                **self.prior_kwargs,
            )
            losses.append(loss)
            nuc.append(stats.nuclear_norm)
            acc.append(stats.accuracy)
        if self.training:
            for j in range(self.num_key_crops):
                self._enqueue(j, global_keys[j])
        metrics = {
            "nuclear_norm": torch.stack(nuc).mean().item(),
            "inst_acc": torch.stack(acc).mean().item(),
            "beta": self.beta if math.isfinite(self.beta) else float("inf"),
        }
        return {"loss_contrastive": torch.stack(losses).mean(), "metrics": metrics}
