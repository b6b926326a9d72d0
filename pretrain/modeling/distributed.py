"""torch.distributed helpers that degrade to no-ops on one process (no rank assumptions)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx


def world_size() -> int:
    """The number of processes (1 without an initialised process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without an initialised process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@torch.no_grad()
def concat_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every process along dim 0, in rank order (no gradient)."""
    n = world_size()
    if n == 1:
        return x
    out = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every process's gradient and returns this rank's slice.

    torch.distributed.nn.functional.all_gather does the same with reduce-scatter (NCCL) or
    all-to-all, which gloo does not offer on every build; all_reduce works on every backend.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.n = x.shape[0]
        out = [torch.empty_like(x) for _ in range(world_size())]
        dist.all_gather(out, x.contiguous())
        return torch.cat(out)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad)
        r = rank()
        return grad[r * ctx.n : (r + 1) * ctx.n]


def all_gather_with_grad(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate ``x`` from every process along ``dim``; gradients reach every contribution.

    The backward sums the gradients that all processes' losses send to each slice, so with DDP's
    gradient averaging the result equals one process computing the loss on the whole batch.
    """
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x.movedim(dim, 0)).movedim(0, dim)
