"""torch.distributed helpers that degrade to no-ops on one process (no rank assumptions).

Every collective here gets input and output tensors of one memory layout (NCCL copies raw bytes:
a channels_last tensor gathered into NCHW buffers, or the reverse, would scramble the images),
and index tensors reach the device without a host sync (:func:`pretrain.utils.device.to_device`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from pretrain.utils.device import to_device


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


@torch.no_grad()
def concat_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every process along dim 0, in rank order (no gradient); the
    buffers share ``x``'s memory layout."""
    n = world_size()
    if n == 1:
        return x
    x = x.contiguous(memory_format=memory_format(x))
    out = [torch.empty_like(x) for _ in range(n)]  # empty_like keeps x's layout
    dist.all_gather(out, x)
    return torch.cat(out)


@torch.no_grad()
def take_global_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows[rank * b : (rank + 1) * b]`` of the global batch (every process's ``x``, b
    rows each, concatenated in rank order), on this process, in that order (no gradient).

    ``rows`` is a host tensor, the same on every process (e.g. ShuffleBN's permutation drawn
    from a shared seed), so every process knows who needs what without asking: each sends only
    the rows the others take, in one ``all_to_all`` (b rows per process in and out, where an
    all-gather would move the whole global batch to every process). One process: ``x[rows]``.
    """
    n, r, b = world_size(), rank(), x.shape[0]
    if rows.numel() != n * b:
        raise ValueError(f"rows has {rows.numel()} entries for {n} processes x {b} rows")
    rows = rows.to(torch.long)
    fmt = memory_format(x)
    if n == 1:
        return x.index_select(0, to_device(rows, x.device)).contiguous(memory_format=fmt)
    wanted = rows.view(n, b)  # wanted[s]: the global rows process s takes
    owner = wanted // b
    # what this process sends to each process s: its rows that s takes, in s's order
    send = [wanted[s][owner[s] == r] % b for s in range(n)]
    # what it receives from each process s, and where each lands in its own order
    mine = owner[r]
    recv_counts = [int((mine == s).sum()) for s in range(n)]
    arrival = torch.empty(b, dtype=torch.long)  # arrival[i]: position of row i in the buffer
    offsets = torch.tensor([0, *recv_counts]).cumsum(0)
    for s in range(n):
        (where,) = (mine == s).nonzero(as_tuple=True)
        arrival[where] = offsets[s] + torch.arange(len(where))
    send_rows = to_device(torch.cat(send), x.device)
    outgoing = x.index_select(0, send_rows).contiguous(memory_format=fmt)
    incoming = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    dist.all_to_all_single(
        incoming, outgoing, output_split_sizes=recv_counts, input_split_sizes=[len(t) for t in send]
    )
    return incoming.index_select(0, to_device(arrival, x.device)).contiguous(memory_format=fmt)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every process's gradient and returns this rank's slice.

    torch.distributed.nn.functional.all_gather does the same with reduce-scatter (NCCL) or
    all-to-all, which gloo does not offer on every build; all_reduce works on every backend.
    """

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
    """Concatenate ``x`` from every process along ``dim``; gradients reach every contribution.

    The backward sums the gradients that all processes' losses send to each slice, so with DDP's
    gradient averaging the result equals one process computing the loss on the whole batch.
    """
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x.movedim(dim, 0)).movedim(0, dim)
