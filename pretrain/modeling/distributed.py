"""torch.distributed helpers that degrade to no-ops on one process (no rank assumptions).

Every collective here moves plainly contiguous tensors (images as :func:`as_rows`), since NCCL
copies raw bytes and a compiled collective allocates its output contiguous: a channels_last tensor
exchanged as it is would arrive scrambled.
"""

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


def memory_format(x: torch.Tensor) -> torch.memory_format:
    """channels_last for a 4-d tensor laid out so (and not also plainly contiguous), else NCHW."""
    channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
    if channels_last and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``(N, features)``: each row of ``x`` flattened in ``x``'s memory order, contiguous (a view
    of a channels_last or plainly contiguous ``x``); :func:`rows_as` undoes it."""
    if memory_format(x) == torch.channels_last:
        x = x.permute(0, 2, 3, 1)
    return x.reshape(x.shape[0], -1).contiguous()


def rows_as(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """:func:`as_rows`'s ``rows`` (any number of them) in the shape and memory layout of
    ``like``'s rows (a view)."""
    if memory_format(like) == torch.channels_last:
        _, c, h, w = like.shape
        return rows.view(rows.shape[0], h, w, c).permute(0, 3, 1, 2)
    return rows.view(rows.shape[0], *like.shape[1:])


@torch.no_grad()
def concat_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every process along dim 0, in rank order (no gradient), in
    ``x``'s memory layout; the collective moves :func:`as_rows`."""
    if world_size() == 1:
        return x
    rows = as_rows(x)
    out = [torch.empty_like(rows) for _ in range(world_size())]
    dist.all_gather(out, rows)
    return rows_as(torch.cat(out), x)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every process's gradient and returns this rank's slice
    (torch.distributed.nn's all_gather needs reduce-scatter or all-to-all, not on every gloo)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.n = x.shape[0]
        x = x.contiguous()  # first: empty_like would copy a permuted layout into the buffers
        out = [torch.empty_like(x) for _ in range(world_size())]
        dist.all_gather(out, x)
        return torch.cat(out)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad)
        r = rank()
        return grad[r * ctx.n : (r + 1) * ctx.n]


def all_gather_with_grad(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate ``x`` from every process along ``dim``; gradients reach every contribution,
    so with DDP's averaging the result equals one process computing the whole batch's loss."""
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x.movedim(dim, 0)).movedim(0, dim)
