"""ShuffleBN's exchange from a :class:`~pretrain.utils.shuffle_plan.ShufflePlan`.

Each process takes its rows of the shuffled global batch (one ``all_to_all_single``), encodes them
in its BN groups, and gets back the global batch's keys in batch order (one all-gather). Every
index is a view of the plan's device table: no host sync, the same ops at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from pretrain.modeling.distributed import as_rows, concat_all_gather, rows_as, world_size
from pretrain.modeling.distributed import rank as process_rank
from pretrain.utils.shuffle_plan import ShufflePlan

__all__ = ["encode_shuffled", "restore_rows", "take_rows"]


def _check(plan: ShufflePlan, t: torch.Tensor) -> None:
    """Host metadata only (no tensor value is read)."""
    here = (world_size(), process_rank())
    if (plan.world, plan.rank) != here:
        raise ValueError(f"{plan} used on rank {here[1]} of {here[0]} processes")
    if t.shape[0] != plan.b:
        raise ValueError(f"{t.shape[0]} rows for {plan}")
    if plan.table.device != t.device:
        raise ValueError(f"{plan} used with a tensor on {t.device}: move it with plan.to()")


@torch.no_grad()
def take_rows(x: torch.Tensor, plan: ShufflePlan) -> torch.Tensor:
    """This process's ``b`` rows of the shuffled global batch (every process's ``x``), in
    BN-group order; the output keeps ``x``'s memory layout. One process: one ``index_select``."""
    _check(plan, x)
    rows = as_rows(x).index_select(0, plan.send)  # grouped by destination rank
    if plan.world > 1:
        incoming = torch.empty_like(rows)  # source p's rows after those of ranks before p
        dist.all_to_all_single(incoming, rows, *plan.split_sizes())
        rows = incoming.index_select(0, plan.arrange) if plan.arranges else incoming
    return rows_as(rows, x)


@torch.no_grad()
def restore_rows(keys: torch.Tensor, plan: ShufflePlan) -> torch.Tensor:
    """The keys of the whole global batch in batch order (process ``p``'s rows at ``p * b``),
    from this process's ``keys`` of :func:`take_rows`'s rows (in that order): one all-gather
    and one ``index_select``; the same layout as ``keys``."""
    _check(plan, keys)
    return rows_as(concat_all_gather(as_rows(keys)).index_select(0, plan.restore), keys)


@torch.no_grad()
def encode_shuffled(
    x: torch.Tensor, plan: ShufflePlan, encode: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``encode`` (the key encoder) with ShuffleBN from ``plan``: this process takes its rows,
    encodes them in ``plan.splits`` BN groups (``tensor_split``: sizes differ by at most one),
    and gets back the keys of the global batch in batch order (no gradient, as MoCo's keys)."""
    mine = take_rows(x, plan)
    keys = torch.cat([encode(group) for group in mine.tensor_split(plan.splits)])
    return restore_rows(keys, plan)
