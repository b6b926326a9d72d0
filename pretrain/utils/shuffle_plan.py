"""ShuffleBN's plan: which rows of the global key batch each process encodes, in which BN group.

MoCo's ShuffleBN permutes the global key batch before the key encoder, so that a key is not
normalised with its query's BN batch statistics (which would let the model cheat). Here that
permutation is a :class:`ShufflePlan` drawn by the loader from a seed and delivered as data, so
that the exchange's ops and split sizes (:mod:`pretrain.modeling.shuffle`) are the same every step.

With ``b = q * world + r``, process ``p`` sends ``q + 1`` rows to the ``r`` ranks after it and
``q`` to the others: every rank receives ``b`` rows. Stratified, not MoCo's uniform permutation:
each BN group holds an even share of every process's batch every step (MoCo's does only in
expectation, and sometimes mostly one process's batch, the very case ShuffleBN avoids); which rows
go where stays uniformly random. One process with ``splits`` groups (dividing ``b``) draws the
plan of ``splits`` processes with one group each, so that ``MODEL.KEY_BN_SPLITS`` emulates them.
"""

from __future__ import annotations

import dataclasses

import torch

from pretrain.utils.device import to_device

__all__ = ["ShufflePlan", "shuffle_plan", "split_size"]


def split_size(world: int, b: int, src: int, dst: int) -> int:
    """The rows process ``src`` sends to rank ``dst`` (``b`` rows per process): ``b // world``,
    one more to the ``b % world`` ranks after ``src``."""
    return b // world + int((dst - src - 1) % world < b % world)  # no divmod: dynamo lacks it


@dataclasses.dataclass(frozen=True, eq=False)
class ShufflePlan:
    """One process's part of a ShuffleBN exchange, as one int64 ``table`` (one copy to the
    device) of the same shape for every seed:

    * :attr:`send` ``(b,)``: the rows to send, grouped by destination rank in rank order;
    * :attr:`arrange` ``(b,)``: position ``j`` of this rank's BN-group order holds row
      ``arrange[j]`` of what the all-to-all received;
    * :attr:`restore` ``(world * b,)``: global row ``i``'s key is row ``restore[i]`` of the
      all-gathered keys.
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
        """Whether the received rows are reordered before the BN groups (fixed by the sizes)."""
        return self.world > 1 and self.splits > 1

    def split_sizes(self) -> tuple[list[int] | None, list[int] | None]:
        """The all-to-all's (output, input) split sizes: the rows this process receives from
        and sends to each rank; ``(None, None)`` where they are all ``b / world``."""
        if self.b % self.world == 0:
            return None, None
        ranks = range(self.world)
        return (
            [split_size(self.world, self.b, p, self.rank) for p in ranks],
            [split_size(self.world, self.b, self.rank, d) for d in ranks],
        )

    def global_order(self) -> torch.Tensor:
        """``(world * b,)``: rank ``d`` encodes global rows ``order[d * b : (d + 1) * b]``, in
        its BN-group order (the inverse of :attr:`restore`)."""
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
    """The ShuffleBN plan of process ``rank`` among ``world`` processes of ``b`` rows each and
    ``splits`` BN groups: every process draws the same global plan from ``seed`` on the CPU (in
    a data worker) and keeps its part."""
    if not 1 <= splits <= b or world < 1:
        raise ValueError(
            f"world {world}, per-process batch {b} and MODEL.KEY_BN_SPLITS {splits}: "
            "need world >= 1 and 1 <= MODEL.KEY_BN_SPLITS <= the per-process batch"
        )
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} processes")
    gen = torch.Generator().manual_seed(seed)
    if world == 1 and splits > 1 and b % splits == 0:  # as splits processes of b / splits rows
        sends = shuffle_plan(seed, splits, b // splits, 1, rank=0).global_order().view(1, b)
    else:
        sends = torch.stack([torch.randperm(b, generator=gen) for _ in range(world)])  # (src, b)
    sizes = torch.tensor([[split_size(world, b, p, d) for d in range(world)] for p in range(world)])
    pieces = [sends[p].split(sizes[p].tolist()) for p in range(world)]  # [src][dst]
    # received[d]: the global rows rank d receives, source ranks in rank order
    received = torch.stack(
        [torch.cat([pieces[p][d] + p * b for p in range(world)]) for d in range(world)]
    )
    arranges = torch.arange(b).expand(world, b)
    if world > 1 and splits > 1:
        # deal the received rows one from each source in turn, the sources in a random order,
        # those with a row more first: any run of positions (a BN group) holds as even a share
        # of every source as fits
        j, rows = torch.arange(b), []
        for d in range(world):
            counts = sizes[:, d]
            perm = torch.randperm(world, generator=gen)
            turn = perm[torch.sort(counts[perm], descending=True, stable=True).indices]
            rows.append((counts.cumsum(0) - counts)[turn[j % world]] + j // world)
        arranges = torch.stack(rows)
    order = received.gather(1, arranges).flatten()  # rank d encodes order[d * b : (d + 1) * b]
    restore = torch.empty_like(order)
    restore[order] = torch.arange(world * b)
    table = torch.cat([sends[rank], arranges[rank], restore])
    return ShufflePlan(world=world, rank=rank, b=b, splits=splits, table=table)
