"""The encoders' BatchNorm: counted by its owner, and synchronised without a host sync per layer.

:class:`BatchNorm2d` is ``nn.BatchNorm2d`` whose training forwards do not count themselves: the
model knows how many forwards a step makes and adds them to every layer's ``num_batches_tracked``
in one ``_foreach_add_`` (:func:`add_counted_batches`) instead of an add per layer and forward
(212 of a ResNet-50 multi-crop step's ~3,000 device ops), with no per-call Python state for a
compiled forward to guard on.

:class:`SyncBatchNorm` synchronises the training statistics across processes. Not
``torch.nn.SyncBatchNorm``: it masks empty batches with a host sync in every layer and refuses
CPU tensors. Not detectron2's ``NaiveSyncBatchNorm``: it computes E[x^2] - E[x]^2 in the input's
dtype (bfloat16 under autocast). Here every process has the same non-empty batch, so nothing is
masked: plain float32 ops that torch.compile traces whole, one all-gather of (mean, var) per
forward and one all-reduce per backward. Weight and bias gradients are this process's (DDP
averages them), as in torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from pretrain.modeling.distributed import memory_format
from pretrain.utils.compiled import in_compiled_graph

__all__ = ["BatchNorm2d", "SyncBatchNorm", "add_counted_batches", "convert_batchnorm"]


# torch >= 2.13 calls it all_gather_single (all_gather_into_tensor warns there, deprecated); the
# older name is the only one before. torch.compile traces either as the same functional collective.
_all_gather_single = getattr(dist, "all_gather_single", None) or getattr(
    dist, "all_gather_into_tensor", None
)


def _per_channel(v: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, 1, 1)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training BatchNorm over every process's batch (equal, non-empty); also returns the
    global mean and biased variance, for the running statistics."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        world = dist.get_world_size()
        var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)  # float32 (C,)
        stats = mean.new_empty(world * 2 * mean.numel())
        _all_gather_single(stats, torch.cat([mean, var]))
        means, variances = stats.view(world, 2, -1).unbind(1)  # (world, C) each
        mean = means.mean(0)  # equal counts: the variances combined around the global mean
        var = (variances + (means - mean).square()).mean(0)
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)  # no zero gradients for (mean, var)
        # y = x * scale + shift (as F.batch_norm on the CPU), in float32, written in x's dtype
        # and layout by the same pass: eager through out=; compiled, the cast fuses with it.
        # Without copy=True (float32: no cast) torch 2.11's compiled backward gives zero
        # gradients to everything before this layer.
        scale = invstd * weight
        shift = _per_channel(bias - mean * scale)
        if in_compiled_graph():
            y = torch.addcmul(shift, x, _per_channel(scale)).to(x.dtype, copy=True)
        else:
            y = torch.empty_like(x)
            torch.addcmul(shift, x, _per_channel(scale), out=y)
        return y, mean, var

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad: torch.Tensor, *_: torch.Tensor
    ) -> tuple:
        x, weight, mean, invstd = ctx.saved_tensors
        grad = grad.contiguous(memory_format=memory_format(x))
        xmu = x - _per_channel(mean)  # float32
        sum_dy, sum_dy_xmu = grad.sum((0, 2, 3), dtype=torch.float32), (grad * xmu).sum((0, 2, 3))
        sums = torch.cat([sum_dy, sum_dy_xmu])
        dist.all_reduce(sums)  # every process's sums; the weight and bias get this process's
        mean_dy, mean_dy_xmu = (sums / (x.numel() // x.shape[1] * dist.get_world_size())).chunk(2)
        # (grad - mean_dy - xmu * invstd^2 * mean_dy_xmu) * scale in two passes
        scale = invstd * weight
        grad_input = torch.addcmul(_per_channel(-mean_dy * scale), grad, _per_channel(scale))
        grad_input.addcmul_(xmu, _per_channel(-invstd.square() * mean_dy_xmu * scale))
        return grad_input.to(grad.dtype), sum_dy_xmu * invstd, sum_dy, None


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training forwards leave ``num_batches_tracked`` to their owner,
    which adds them with :func:`add_counted_batches` (see the module docstring)."""

    def _counts(self) -> bool:
        """Whether ``nn.BatchNorm2d`` would count this forward."""
        return (
            self.training
            and self.track_running_stats
            and self.momentum is not None
            and self.num_batches_tracked is not None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._counts():
            return super().forward(x)
        self._check_input_dim(x)
        # nn.BatchNorm2d's own call in training mode, without its num_batches_tracked.add_(1)
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, True, self.momentum,
            self.eps,
        )  # fmt: skip


class SyncBatchNorm(BatchNorm2d):
    """BatchNorm2d whose training statistics span every process, without host syncs (see the
    module docstring). Plain BatchNorm2d in eval mode and without a process group."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not (dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        if x.dim() != 4 or x.shape[0] == 0:
            raise ValueError(f"SyncBatchNorm expects a non-empty (N, C, H, W) batch, got {x.shape}")
        if self.momentum is None or not self.affine:
            raise ValueError("SyncBatchNorm needs a momentum and affine parameters")
        y, mean, var = _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.eps)
        if self.running_mean is not None:  # buffer updates the compiled graph makes too
            total = x.numel() // x.shape[1] * dist.get_world_size()
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * (total / max(total - 1, 1)), self.momentum)
        return y


def add_counted_batches(*counts: tuple[nn.Module, int]) -> None:
    """For each ``(module, forwards)``, add ``forwards`` to the ``num_batches_tracked`` of every
    counting :class:`BatchNorm2d` of ``module``, in one ``_foreach_add_`` per distinct number."""
    groups: dict[int, list[torch.Tensor]] = {}
    for module, forwards in counts:
        for m in module.modules():
            if isinstance(m, BatchNorm2d) and m._counts() and forwards:
                groups.setdefault(forwards, []).append(m.num_batches_tracked)
    for forwards, tracked in groups.items():
        torch._foreach_add_(tracked, forwards)


def convert_batchnorm(module: nn.Module, cls: type[BatchNorm2d] = BatchNorm2d) -> nn.Module:
    """``module`` with every ``nn.BatchNorm2d`` that is not a ``cls`` replaced by one (same
    state and mode)."""
    if isinstance(module, nn.BatchNorm2d) and type(module) is not cls:
        new = cls(
            module.num_features, module.eps, module.momentum, module.affine,
            module.track_running_stats,
        )  # fmt: skip
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_batchnorm(child, cls))
    return module
