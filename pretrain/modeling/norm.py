"""The encoders' BatchNorm: counted by its owner, and synchronised without a host sync per layer.

:class:`BatchNorm2d` is ``nn.BatchNorm2d`` (same state, same ``F.batch_norm`` call) whose
training forwards do not count themselves: the module that runs them knows how many forwards a
step makes (the model: one per resolution group of query views, one per key BN group) and adds
them to every layer's ``num_batches_tracked`` with one ``_foreach_add_`` per step
(:func:`add_counted_batches`), where ``nn.BatchNorm2d`` launches an add per layer and forward
(212 of a ResNet-50 multi-crop step's ~3,000 device ops). The values at the end of each step are
the same. Counting by structure rather than by a counter each forward bumps keeps the forward
free of Python state that changes from call to call: a compiled forward would be recompiled for
every new value of such a counter (``torch.compile`` guards on module attributes).

:class:`SyncBatchNorm` synchronises the training statistics across processes.

Why not ``torch.nn.SyncBatchNorm``: its forward drops the statistics of processes with an empty
batch through a boolean mask (``count_all[count_all >= 1]``), whose output size the host reads
back: a host sync in every BN layer of every forward (53 layers x 2 query forwards per step on a
ResNet-50), and it refuses CPU tensors. Why not detectron2's ``NaiveSyncBatchNorm``: its
statistics are E[x^2] - E[x]^2 in the input's dtype (bfloat16 under autocast) and it launches an
elementwise pass per term.

Here every process has the same, non-empty batch (the pretraining sampler guarantees it; an
empty batch is refused), so nothing is masked. On CUDA the statistics, the reduction across
processes and the elementwise passes are torch's fused kernels (those ``torch.nn.SyncBatchNorm``
uses); on the CPU the same arithmetic in float32 with plain ops, so that multi-process CPU runs
and tests go through this module too. One all-gather of (mean, invstd) per layer forward and one
all-reduce of (sum dy, sum dy (x - mean)) per layer backward, input and output of each in one
layout. Gradients of weight and bias are this process's (DDP averages them), as in torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from pretrain.modeling.distributed import memory_format

__all__ = ["BatchNorm2d", "SyncBatchNorm", "add_counted_batches", "convert_batchnorm"]


def _all_gather_rows(x: torch.Tensor, world: int) -> torch.Tensor:
    """(world, *x.shape): ``x`` of every process, in rank order (x contiguous, 1-d)."""
    out = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
    if dist.get_backend() == "gloo":  # gloo has no all_gather_into_tensor
        dist.all_gather(list(out.unbind(0)), x)
    else:
        dist.all_gather_into_tensor(out, x)
    return out


def _per_channel(v: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, 1, 1)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        momentum: float,
        world: int,
    ) -> torch.Tensor:
        channels = x.shape[1]
        count = x.numel() // channels  # per process; the same on every process
        if x.is_cuda:
            mean, invstd = torch.batch_norm_stats(x, eps)  # float32 (C,) each
        else:
            var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
            invstd = torch.rsqrt(var + eps)
        stats = _all_gather_rows(torch.cat([mean, invstd]), world)  # (world, 2C)
        mean_all, invstd_all = stats[:, :channels], stats[:, channels:]
        if x.is_cuda:
            counts = torch.full((world,), count, dtype=mean.dtype, device=x.device)
            mean, invstd = torch.batch_norm_gather_stats_with_counts(
                x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts
            )
        else:  # the same reduction: equal counts, variances combined around the global mean
            mean = mean_all.mean(0)
            var_all = invstd_all.pow(-2) - eps
            var = (var_all + (mean_all - mean).pow(2)).mean(0)
            invstd = torch.rsqrt(var + eps)
            if running_mean is not None:
                total = count * world
                running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                unbiased = var * (total / max(total - 1, 1))
                running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count, ctx.world = count, world
        if x.is_cuda:
            return torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps)
        scale = invstd * weight
        y = (x.float() - _per_channel(mean)) * _per_channel(scale) + _per_channel(bias)
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        x, weight, mean, invstd = ctx.saved_tensors
        channels = x.shape[1]
        grad = grad.contiguous(memory_format=memory_format(x))
        if x.is_cuda:
            sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
                grad, x, mean, invstd, weight, True, True, True
            )
        else:
            g, xmu = grad.float(), x.float() - _per_channel(mean)
            sum_dy, sum_dy_xmu = g.sum((0, 2, 3)), (g * xmu).sum((0, 2, 3))
            grad_weight, grad_bias = sum_dy_xmu * invstd, sum_dy
        combined = torch.cat([sum_dy, sum_dy_xmu])
        dist.all_reduce(combined)
        sum_dy, sum_dy_xmu = combined[:channels], combined[channels:]
        if x.is_cuda:
            counts = torch.full((ctx.world,), ctx.count, dtype=torch.int32, device=x.device)
            w = weight.to(mean.dtype)
            grad_input = torch.batch_norm_backward_elemt(
                grad, x, mean, invstd, w, sum_dy, sum_dy_xmu, counts
            )
        else:
            total = ctx.count * ctx.world
            mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
            grad_input = (
                (g - _per_channel(mean_dy) - xmu * _per_channel(invstd.pow(2) * mean_dy_xmu))
                * _per_channel(invstd * weight)
            ).to(grad.dtype)
        return grad_input, grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), *[None] * 5


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
        return _SyncBatchNormFunction.apply(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.eps,
            self.momentum,
            dist.get_world_size(),
        )


def add_counted_batches(*counts: tuple[nn.Module, int]) -> None:
    """Add ``forwards`` to the ``num_batches_tracked`` of every :class:`BatchNorm2d` of
    ``module`` that counts its forwards (in training mode, tracking running statistics with a
    momentum), for each ``(module, forwards)``: one ``_foreach_add_`` per distinct number (one
    per step in practice: the model's encoders make as many forwards each)."""
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
