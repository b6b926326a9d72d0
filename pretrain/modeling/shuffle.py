"""ShuffleBN from a static plan: fixed equal splits, indices drawn ahead of the step.

Today's ShuffleBN (:meth:`pretrain.modeling.meta_arch.MultiViewMoCo._encode_keys` with
:func:`pretrain.modeling.distributed.take_global_rows`) permutes the global key batch with MoCo's
uniform permutation: the rows each process takes from each other one, and so the all-to-all's
split sizes, change every step and are computed on the host. Here every process sends exactly
``b / world`` rows to every process, so the exchange is one ``all_to_all_single`` of equal splits
whose shapes never change, and everything that depends on the seed is a small index table
(:class:`ShufflePlan`) that the loader can draw in its workers and deliver with the batch, as
data: a CUDA graph or a compiled step reads it as a device tensor (copied into its static buffer
with :meth:`ShufflePlan.copy_`), never as a Python constant.

**Why stratified is as good as MoCo's uniform permutation.** ShuffleBN exists so that a key is
not normalised with the statistics of the BN batch its query was normalised with (the query
encoder's BN batch is its own process's ``b`` rows): a model that can read the positive pair's
shared batch statistics cheats on the pretext task. MoCo's permutation puts into each key BN
group of ``b`` rows, in expectation, ``b / world`` rows of every process's batch; how many is
hypergeometric, so some steps give a group that is mostly one process's batch (all of it with
probability ``world / C(world * b, b)``), the very case ShuffleBN is there to avoid.
The stratified plan gives every group that expected mix every step: the key BN group of rank
``d`` holds exactly ``b / world`` rows of every process's batch (with ``world > 1`` never only
the query's own), and only the variance is gone. Which rows a process sends where stays random:
each process sends its rows in the order of a uniform permutation ``sigma_p`` of its ``b`` rows,
``b / world`` to each destination in rank order, so the rows process ``p`` sends to ``d`` are a
uniform ``b / world``-subset of its batch, and the ``world`` subsets a uniform ordered partition
of it (a uniform permutation cut into equal blocks; exactly the law of the uniform permutation
conditioned on equal counts). With ``splits > 1`` BN groups of ``b / splits`` rows each, the
received rows are dealt into the groups source by source in a random order of the sources, so
that every group holds ``b / (splits * world)`` rows of every process when that divides (else
the floor or the ceiling of it: groups smaller than ``world`` get rows of distinct processes),
where a uniform permutation again gives only that mix in expectation. With one process there is
nothing to stratify: the plan is a uniform random grouping of the batch, as today's.

**When it does not fit.** Equal splits need ``b % world == 0`` (``SOLVER.IMS_PER_BATCH``
divisible by the square of the number of processes) and equal groups ``b % splits == 0``
(``MODEL.KEY_BN_SPLITS``); :func:`static_shuffle_problem` says which fails, and the caller then
keeps today's host-planned path (``take_global_rows`` with a ``torch.randperm`` permutation,
``MultiViewMoCo._encode_keys``), which needs neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from pretrain.modeling.distributed import concat_all_gather, memory_format, world_size
from pretrain.modeling.distributed import rank as process_rank
from pretrain.utils.device import to_device

__all__ = [
    "ShufflePlan",
    "encode_shuffled",
    "restore_rows_static",
    "shuffle_plan",
    "static_shuffle_problem",
    "take_rows_static",
]


def static_shuffle_problem(world: int, b: int, splits: int) -> str | None:
    """Why :func:`shuffle_plan` cannot plan ``world`` processes of ``b`` rows in ``splits`` BN
    groups each, or None when it can. The caller falls back to today's host-planned ShuffleBN
    (:func:`pretrain.modeling.distributed.take_global_rows`) when this is not None."""
    if min(world, b, splits) < 1:
        return f"world {world}, per-process batch {b} and MODEL.KEY_BN_SPLITS {splits} must be >= 1"
    if b % splits:
        return (
            f"the per-process batch {b} (SOLVER.IMS_PER_BATCH / {world} processes) is not "
            f"divisible by MODEL.KEY_BN_SPLITS = {splits}"
        )
    if b % world:
        return (
            f"the per-process batch {b} (SOLVER.IMS_PER_BATCH = {b * world} over {world} "
            f"processes) is not divisible by the {world} processes: the static ShuffleBN sends "
            f"b / {world} rows to every process (SOLVER.IMS_PER_BATCH must be divisible by "
            f"{world * world}); use the host-planned ShuffleBN (take_global_rows)"
        )
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class ShufflePlan:
    """One process's part of a static ShuffleBN exchange (see the module's docstring).

    ``table`` is one int64 tensor of ``2 * b + world * b`` entries (one tensor: one copy to the
    device, one pinned block, one static buffer in a graph), the same shape for every seed:

    * :attr:`send` ``(b,)``: the rows of this process's batch to send, ``b / world`` to each
      rank in rank order;
    * :attr:`arrange` ``(b,)``: position ``j`` of this rank's BN-group order holds row
      ``arrange[j]`` of what the all-to-all received (rank ``p``'s rows at ``p * b / world``
      onwards); the identity when there is one group or one process (:attr:`arranges` False);
    * :attr:`restore` ``(world * b,)``: the key of global row ``i`` (process ``i // b``'s row
      ``i % b``) is row ``restore[i]`` of the all-gathered keys (rank order, each rank's keys
      in its BN-group order); the same on every rank.
    """

    world: int
    rank: int
    b: int
    splits: int
    table: torch.Tensor

    @property
    def send(self) -> torch.Tensor:
        return self.table[: self.b]

    @property
    def arrange(self) -> torch.Tensor:
        return self.table[self.b : 2 * self.b]

    @property
    def restore(self) -> torch.Tensor:
        return self.table[2 * self.b :]

    @property
    def arranges(self) -> bool:
        """Whether the received rows are reordered before the BN groups (a host decision fixed
        by the sizes: one group is permutation invariant, one process's ``send`` is enough)."""
        return self.world > 1 and self.splits > 1

    def global_order(self) -> torch.Tensor:
        """``(world * b,)``: rank ``d`` encodes global rows ``order[d * b : (d + 1) * b]``, in
        that order (the inverse of :attr:`restore`): the permutation today's path
        (``take_global_rows``) would need to take the same rows. For checks, not for the step."""
        return torch.argsort(self.restore)

    def to(self, device: torch.device | str) -> ShufflePlan:
        """This plan on ``device``: non-blocking, through pinned memory on CUDA (no host sync)."""
        return dataclasses.replace(self, table=to_device(self.table, device))

    def pin_memory(self) -> ShufflePlan:
        """This plan in pinned memory (what a DataLoader with ``pin_memory`` calls)."""
        return dataclasses.replace(self, table=self.table.pin_memory())

    def copy_(self, src: ShufflePlan) -> ShufflePlan:
        """Writes ``src``'s values into this plan's table in place (a captured graph's static
        buffer), non-blocking; the sizes must match."""
        sizes = (self.world, self.rank, self.b, self.splits)
        if (src.world, src.rank, src.b, src.splits) != sizes:
            raise ValueError(f"a plan for {src} cannot fill one for {self}")
        self.table.copy_(src.table, non_blocking=True)
        return self

    def __repr__(self) -> str:
        return (
            f"ShufflePlan(world={self.world}, rank={self.rank}, b={self.b}, "
            f"splits={self.splits}, device={self.table.device})"
        )


def shuffle_plan(seed: int, world: int, b: int, splits: int, *, rank: int) -> ShufflePlan:
    """The static ShuffleBN plan of process ``rank`` among ``world`` processes of ``b`` rows
    each, ``splits`` BN groups per process, for ``seed`` (the same on every process: each
    computes the same global plan and keeps its part). A pure function of its arguments, drawn
    with a CPU generator, so that it can run in a data worker; host tensors.

    Raises ValueError when :func:`static_shuffle_problem` names a problem.
    """
    problem = static_shuffle_problem(world, b, splits)
    if problem is not None:
        raise ValueError(problem)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} processes")
    m = b // world
    gen = torch.Generator().manual_seed(seed)
    sends = torch.stack([torch.randperm(b, generator=gen) for _ in range(world)])  # (src, b)
    # received[d, p * m + k]: the global row that rank d receives as the k-th from rank p
    offsets = (torch.arange(world) * b).view(world, 1, 1)
    received = (sends.view(world, world, m) + offsets).transpose(0, 1).reshape(world, b)
    arranges = torch.arange(b).expand(world, b)
    if world > 1 and splits > 1:
        # deal the received rows source by source, the sources in a random order per rank:
        # position j takes the (j // world)-th row of source pi[j % world], so every run of
        # b / splits positions (a BN group) holds as even a share of every source as fits
        sources = torch.stack([torch.randperm(world, generator=gen) for _ in range(world)])
        j = torch.arange(b)
        arranges = sources[:, j % world] * m + j // world
    order = received.gather(1, arranges).flatten()  # rank d encodes order[d * b : (d + 1) * b]
    restore = torch.empty_like(order)
    restore[order] = torch.arange(world * b)
    table = torch.cat([sends[rank], arranges[rank], restore])
    return ShufflePlan(world=world, rank=rank, b=b, splits=splits, table=table)


def _check(plan: ShufflePlan, t: torch.Tensor, rows: int) -> None:
    """Host metadata only (no tensor value is read)."""
    here = (world_size(), process_rank())
    if (plan.world, plan.rank) != here:
        raise ValueError(f"{plan} used on rank {here[1]} of {here[0]} processes")
    if t.shape[0] != rows:
        raise ValueError(f"{t.shape[0]} rows for {plan}")
    if plan.table.device != t.device:
        raise ValueError(f"{plan} used with a tensor on {t.device}: move it with plan.to()")


def _index_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)`` in ``x``'s memory layout, in one op: a channels_last tensor
    is indexed as its (N, H, W, C) view, whose rows are contiguous (index_select's output is
    plainly contiguous whatever its input: NCHW here, which a collective would then scramble)."""
    if memory_format(x) == torch.channels_last:
        return x.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return x.index_select(0, index)


@torch.no_grad()
def take_rows_static(x: torch.Tensor, plan: ShufflePlan) -> torch.Tensor:
    """This process's rows of the shuffled global batch, in BN-group order: ``b / world`` rows
    of every process's ``x`` (b rows), with one ``all_to_all_single`` of equal splits (no split
    sizes: the same collective every step). ``plan`` on ``x``'s device; no host sync, no value
    read; the output keeps ``x``'s memory layout. One process: one ``index_select``."""
    _check(plan, x, plan.b)
    outgoing = _index_rows(x, plan.send)  # grouped by destination rank, b / world rows each
    if plan.world == 1:
        return outgoing
    incoming = torch.empty_like(outgoing)  # same shape and strides: one layout for NCCL
    dist.all_to_all_single(incoming, outgoing)  # source p's rows at p * b / world onwards
    if not plan.arranges:
        return incoming
    return _index_rows(incoming, plan.arrange)


@torch.no_grad()
def restore_rows_static(keys: torch.Tensor, plan: ShufflePlan) -> torch.Tensor:
    """The keys of the whole global batch in batch order (process ``p``'s rows at ``p * b``),
    from this process's ``keys`` of :func:`take_rows_static`'s rows (in that order): one
    all-gather and one ``index_select``; the same layout as ``keys``."""
    _check(plan, keys, plan.b)
    return _index_rows(concat_all_gather(keys), plan.restore)


@torch.no_grad()
def encode_shuffled(
    x: torch.Tensor, plan: ShufflePlan, encode: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``encode`` (the key encoder) with ShuffleBN from ``plan``: this process takes its rows,
    encodes them in ``plan.splits`` BN groups of ``b / splits`` rows, and gets back the keys
    of the global batch in batch order (no gradient, as MoCo's keys)."""
    mine = take_rows_static(x, plan)
    keys = torch.cat([encode(group) for group in mine.chunk(plan.splits)])
    return restore_rows_static(keys, plan)
