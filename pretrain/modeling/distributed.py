"""torch.distributed helpers that degrade to no-ops on one process (no rank assumptions)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
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
