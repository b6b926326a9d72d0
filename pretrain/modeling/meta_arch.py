"""Multi-view momentum contrast: LORAC, MoCo-M and MoCo-v2 in one model (paper Sec. 3, Alg. 1).

Each image gives V views; the first J large crops are key crops, each encoded by the momentum
encoder g (with ShuffleBN) and with its own queue of K negatives. The query encoder f runs on the
views the objective reads and on those LOSS.LOWRANK_VIEWS names whether or not the prior is on,
so that LORAC and its MoCo-M twin (prior "none") see the same BN batches. MoCo-v2 is two views,
one key crop, prior "none" and LOWRANK_VIEWS "queries". The views arrive augmented and normalised,
with the loader's ShuffleBN plans.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch
from fvcore.common.config import CfgNode
from torch import nn

from pretrain.config.step_policy import EAGER_STEP, StepPolicy
from pretrain.losses.lorac import LoracLoss, take_views
from pretrain.modeling.build import META_ARCH_REGISTRY
from pretrain.modeling.distributed import all_gather_with_grad, concat_all_gather, rank, world_size
from pretrain.modeling.encoder import Encoder, convert_norm
from pretrain.modeling.norm import add_counted_batches
from pretrain.modeling.shuffle import encode_shuffled
from pretrain.utils.compiled import in_compiled_graph
from pretrain.utils.pixels import normalize_, to_unit_float
from pretrain.utils.shuffle_plan import ShufflePlan

__all__ = ["MultiViewMoCo"]


@META_ARCH_REGISTRY.register()
class MultiViewMoCo(nn.Module):
    def __init__(
        self,
        *,
        arch: str,
        stem: str,
        hidden_dim: int,
        out_dim: int,
        view_sizes: list[int],
        num_key_crops: int,
        queue_size: int,
        momentum: float,
        criterion: LoracLoss,
        shuffle_bn: bool,
        key_bn_splits: int,
        norm: str,
        channels_last: bool,
    ) -> None:
        super().__init__()
        self.encoder_q = Encoder(arch, hidden_dim, out_dim, stem)
        # plain BN (counted on the host: pretrain.modeling.norm): ShuffleBN handles leakage
        self.encoder_k = convert_norm(copy.deepcopy(self.encoder_q), "BN")
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.encoder_q = convert_norm(self.encoder_q, norm)
        self.view_sizes, self.num_key_crops = view_sizes, num_key_crops
        self.momentum = momentum
        self.criterion = criterion
        if list(criterion.key_views) != list(range(num_key_crops)):
            raise ValueError(
                f"the loss's key views {criterion.key_views} are not the first {num_key_crops}"
            )
        self.key_views = list(criterion.key_views)
        self.lowrank_views = list(criterion.lowrank_views)
        # f runs on the views the objective reads (a lone key crop is no query of its own key),
        # and on the LOWRANK_VIEWS with the prior off too: a MoCo-M twin sees LORAC's BN batches.
        used = {v for j in self.key_views for v in range(len(view_sizes)) if v != j}
        self.query_views = sorted(used | set(self.lowrank_views))
        self.shuffle_bn, self.key_bn_splits = shuffle_bn, key_bn_splits
        self.channels_last = channels_last
        queues = nn.functional.normalize(torch.randn(num_key_crops, queue_size, out_dim), dim=-1)
        self.register_buffer("queues", queues)  # (J, K, d)
        # on the device: a host pointer would be a sync, and would change every step's ops
        self.register_buffer("queue_ptr", torch.zeros(num_key_crops, dtype=torch.long))
        # the key encoder's conv and linear weights in the autocast dtype (see _key_weights)
        self._lowp_names = [
            f"{name}.{p}"
            for name, m in self.encoder_k.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear))
            for p, t in m.named_parameters(recurse=False)
            if t is not None
        ]
        self._lowp: list[torch.Tensor] | None = None
        if channels_last:
            self.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(
        cls, cfg: CfgNode, world_size: int = 1, policy: StepPolicy = EAGER_STEP
    ) -> dict[str, Any]:
        inp, mod = cfg.INPUT, cfg.MODEL
        sizes = [inp.LARGE_SIZE] * inp.LARGE_CROPS + [inp.SMALL_SIZE] * inp.SMALL_CROPS
        norm = mod.NORM
        if world_size == 1:
            norm = "BN"
        elif norm == "auto":
            norm = "SyncBN"
        return {
            "arch": mod.ARCH,
            "stem": mod.STEM,
            "hidden_dim": mod.HEAD_HIDDEN_DIM,
            "out_dim": mod.HEAD_OUT_DIM,
            "view_sizes": sizes,
            "num_key_crops": inp.KEY_CROPS,
            "queue_size": mod.QUEUE_SIZE,
            "momentum": mod.MOMENTUM,
            "criterion": LoracLoss.from_config(cfg, policy.nuclear_norm(cfg.LOSS.NUCLEAR_NORM)),
            "shuffle_bn": mod.SHUFFLE_BN,
            "key_bn_splits": mod.KEY_BN_SPLITS,
            "norm": norm,
            "channels_last": mod.CHANNELS_LAST,
        }

    # -- what the model's users call ----------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.queues.device

    @torch.no_grad()
    def backbone_features(self, images: torch.Tensor) -> torch.Tensor:
        """The query encoder's backbone features (B, D) of ``images`` (B, 3, h, w) in eval mode
        (no BN collective); uint8 images are normalised as the training views, float ones taken
        as normalised."""
        x = images.to(self.device, non_blocking=True)
        if not x.is_floating_point():
            x = normalize_(to_unit_float(x))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        backbone = self.encoder_q.backbone
        was_training = backbone.training
        backbone.eval()
        try:
            return backbone(x)
        finally:
            backbone.train(was_training)

    # -- hooks' entry points -------------------------------------------------------------
    def set_beta(self, beta: float) -> None:
        """Set the prior's beta (math.inf switches the prior off: MoCo-M)."""
        self.criterion.beta = float(beta)

    @torch.no_grad()
    def momentum_update(self) -> None:
        """theta_k <- m theta_k + (1 - m) theta_q (parameters only, as in MoCo)."""
        # no .detach() per parameter (one op each): under no_grad the lerp records no graph
        k = list(self.encoder_k.parameters())
        q = list(self.encoder_q.parameters())
        torch._foreach_lerp_(k, q, 1.0 - self.momentum)

    # -- forward -------------------------------------------------------------------------
    def _prepare(self, batch: dict[str, Any]) -> list[torch.Tensor]:
        views = [v.to(self.device, non_blocking=True) for v in batch["views"]]
        if len(views) != len(self.view_sizes):
            raise ValueError(f"expected {len(self.view_sizes)} views, got {len(views)}")
        if any(not v.is_floating_point() for v in views):
            raise ValueError(
                "views must be float, augmented and normalised "
                "(pretrain.data.loader.augment_views_on_device), got "
                f"{sorted({str(v.dtype) for v in views})}"
            )
        if self.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    def _encode_queries(self, views: list[torch.Tensor]) -> tuple[list[torch.Tensor | None], int]:
        """f on the views the objective reads, one forward per resolution (BN statistics over
        same-size crops); None for the others. Also the number of forwards."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in self.query_views:
            groups[tuple(views[i].shape[-2:])].append(i)
        out: list[torch.Tensor | None] = [None] * len(views)
        for idx in groups.values():
            emb = self.encoder_q(torch.cat([views[i] for i in idx]))
            for i, e in zip(idx, emb.chunk(len(idx)), strict=True):
                out[i] = e
        return out, len(groups)

    @torch.no_grad()
    def _key_weights(self, device_type: str) -> dict[str, torch.Tensor] | None:
        """The key encoder's conv and linear weights cast once per step to the autocast dtype
        (None without autocast): autocast caches casts only of tensors that require grad, so it
        would cast them again for every key crop. Same rounding, so the same keys bit for bit."""
        if not torch.is_autocast_enabled(device_type):
            return None
        dtype = torch.get_autocast_dtype(device_type)
        params = dict(self.encoder_k.named_parameters())
        src = [params[n] for n in self._lowp_names]
        if in_compiled_graph():  # casts in the graph
            return {n: p.to(dtype) for n, p in zip(self._lowp_names, src, strict=True)}
        if (
            self._lowp is None
            or self._lowp[0].dtype != dtype
            or self._lowp[0].device != src[0].device
        ):
            self._lowp = [torch.empty_like(p, dtype=dtype) for p in src]  # keeps channels_last
        torch._foreach_copy_(self._lowp, src)
        return dict(zip(self._lowp_names, self._lowp, strict=True))

    def _key_encoder(
        self, x: torch.Tensor, weights: dict[str, torch.Tensor] | None
    ) -> torch.Tensor:
        if weights is None:
            return self.encoder_k(x)
        return torch.func.functional_call(self.encoder_k, weights, (x,), strict=False)

    @property
    def uses_shuffle_plans(self) -> bool:
        """Whether the forward reads ``batch["shuffle_plans"]`` (ShuffleBN across BN groups)."""
        return self.shuffle_bn and world_size() * self.key_bn_splits > 1

    def _key_forwards(self) -> int:
        """Forwards of the key encoder per key crop (its BN groups)."""
        return self.key_bn_splits if self.uses_shuffle_plans else 1

    @torch.no_grad()
    def _encode_keys(
        self, x: torch.Tensor, plan: ShufflePlan | None, weights: dict[str, torch.Tensor] | None
    ) -> torch.Tensor:
        """g(x): the keys of the global batch, in batch order, with ShuffleBN from ``plan``
        (None: one BN group, where BN is permutation invariant)."""
        if plan is None:
            return concat_all_gather(self._key_encoder(x, weights))
        return encode_shuffled(x, plan, lambda group: self._key_encoder(group, weights))

    @torch.no_grad()
    def _enqueue(self, keys: torch.Tensor) -> None:
        """Write the global keys (J, n, d) into the queues at ``queue_ptr`` and advance it, on
        the device, in one ``index_copy_`` (K % n == 0: a batch never wraps around)."""
        j, k = self.queues.shape[:2]
        n = keys.shape[1]
        if k % n:
            raise ValueError(f"MODEL.QUEUE_SIZE {k} is not divisible by the global batch {n}")
        steps = torch.arange(n, device=keys.device)
        rows = self.queue_ptr[:, None] + steps + torch.arange(j, device=keys.device)[:, None] * k
        self.queues.view(j * k, -1).index_copy_(
            0, rows.reshape(-1), keys.reshape(j * n, -1).to(self.queues.dtype)
        )
        self.queue_ptr.add_(n).remainder_(k)

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch["views"]``: V float (B, 3, h, w) normalised views; ``batch["shuffle_plans"]``:
        one :class:`~pretrain.utils.shuffle_plan.ShufflePlan` per key crop, for ShuffleBN."""
        views = self._prepare(batch)
        b = views[0].shape[0]
        plans = [None] * self.num_key_crops
        if self.uses_shuffle_plans:
            plans = list(batch.get("shuffle_plans") or [])
            if len(plans) != self.num_key_crops:
                raise ValueError(
                    f"ShuffleBN needs batch['shuffle_plans']: {self.num_key_crops} "
                    f"ShufflePlan(s), one per key crop, got {len(plans)}"
                )
        encoded, query_forwards = self._encode_queries(views)
        ref = encoded[self.query_views[0]]
        # (V, B, d); a view f skipped is never read by the objective
        q = torch.stack([e if e is not None else ref.new_zeros(ref.shape) for e in encoded])
        weights = self._key_weights(views[0].device.type)
        global_keys = [
            self._encode_keys(views[j], plans[j], weights) for j in range(self.num_key_crops)
        ]
        r = rank()
        keys = torch.stack([k[r * b : (r + 1) * b] for k in global_keys])  # (J, B, d)
        global_lowrank = None
        if self.criterion.prior.batchwise:  # Eq. (15): one P over the global batch
            # a slice for a run of views: q[list] would copy the list to the device each step
            low = take_views(q, self.lowrank_views)
            global_lowrank = all_gather_with_grad(low, dim=1)
        # ||Q||_* only for the log costs a host sync on a GPU with eigh: the eager step skips it
        # on the iterations it does not log (batch["log_stats"]; default: every iteration)
        loss, stats = self.criterion(
            q, keys, self.queues.clone().detach(), global_lowrank, batch.get("log_stats", True)
        )
        if self.training:
            self._enqueue(torch.stack(global_keys))
        # every BN's num_batches_tracked, in one launch
        key_forwards = self.num_key_crops * self._key_forwards()
        add_counted_batches((self.encoder_q, query_forwards), (self.encoder_k, key_forwards))
        metrics = {  # device tensors: the trainer reads them at its logging period
            "log_prior": stats.log_prior.detach(),
            "inst_acc": stats.accuracy.detach(),
            "beta": self.criterion.beta,
        }
        if stats.nuclear_norm is not None:
            metrics = {"nuclear_norm": stats.nuclear_norm.detach(), **metrics}
        return {"loss_contrastive": loss, "metrics": metrics}
