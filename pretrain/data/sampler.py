"""A batch sampler whose output depends only on (seed, iteration): resumes are exact.

Why not torch's ``DistributedSampler`` + worker RNG: after a preemption the data order and the
augmentations would differ from the uninterrupted run. Here iteration ``t`` always yields the
same global batch (a slice of the epoch's seeded permutation) and every sample carries its own
augmentation seed, so a run resumed at iteration ``t`` sees exactly the data it would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["IterationBatchSampler", "sample_seed"]

_MIX = 0x9E3779B97F4A7C15


def sample_seed(seed: int, iteration: int, position: int) -> int:
    """A 63-bit seed unique to (run seed, iteration, position in the global batch)."""
    x = (seed * _MIX + iteration * 0x632BE59BD9B4E019 + position * 0x85EBCA77C2B2AE63) & (
        (1 << 64) - 1
    )
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 29
    return x & ((1 << 63) - 1)


class IterationBatchSampler:
    """Yields, for iterations ``start_iter, start_iter + 1, ...``, this rank's share of the
    global batch as ``[(dataset_index, augmentation_seed), ...]``.

    Epoch ``e`` visits ``torch.randperm(n)`` seeded with ``(seed, e)``; the last incomplete
    global batch of an epoch is dropped (as with ``drop_last=True``).
    """

    def __init__(
        self, size: int, global_batch: int, rank: int, world_size: int, seed: int, start_iter: int
    ) -> None:
        if global_batch % world_size:
            raise ValueError(f"global batch {global_batch} not divisible by {world_size} ranks")
        if size < global_batch:
            raise ValueError(
                f"dataset has {size} images, fewer than one global batch ({global_batch}); "
                "lower SOLVER.IMS_PER_BATCH or add data"
            )
        self.size, self.global_batch = size, global_batch
        self.rank, self.world_size = rank, world_size
        self.seed, self.start_iter = seed, start_iter
        self.iters_per_epoch = size // global_batch

    def _perm(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(sample_seed(self.seed, epoch, -1) & 0xFFFFFFFFFFFF)
        return torch.randperm(self.size, generator=g)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        it = self.start_iter
        epoch, perm = -1, None
        local = self.global_batch // self.world_size
        while True:
            e = it // self.iters_per_epoch
            if e != epoch:
                epoch, perm = e, self._perm(e)
            offset = (it % self.iters_per_epoch) * self.global_batch + self.rank * local
            idx = perm[offset : offset + local].tolist()
            yield [
                (i, sample_seed(self.seed, it, self.rank * local + j)) for j, i in enumerate(idx)
            ]
            it += 1
