"""ShuffleBN's exchange: each process receives exactly its rows of the permuted global batch.

Three CPU processes (gloo) with uneven shares of each other's rows (a random permutation): the
all-to-all result equals indexing the concatenated global batch, for NCHW and channels_last
inputs, and keeps the input's memory layout.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pretrain.modeling.distributed import take_global_rows

B, WORLD = 4, 3


def _global_batch() -> torch.Tensor:
    return torch.arange(WORLD * B * 2 * 3 * 3, dtype=torch.float32).view(WORLD * B, 2, 3, 3)


def _worker(rank: int, init: str, channels_last: bool, seed: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    x = _global_batch()[rank * B : (rank + 1) * B]
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    perm = torch.randperm(WORLD * B, generator=torch.Generator().manual_seed(seed))
    mine = take_global_rows(x, perm)
    torch.save(
        {
            "mine": mine.contiguous(),
            "want": _global_batch()[perm[rank * B : (rank + 1) * B]],
            "layout_kept": mine.is_contiguous(memory_format=torch.channels_last) == channels_last,
        },
        f"{out}.{rank}",
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("channels_last", [False, True])
def test_each_process_gets_its_rows_of_the_permuted_batch(tmp_path, channels_last):
    out = str(tmp_path / "rows")
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_worker, args=(init, channels_last, 7, out), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        got = torch.load(f"{out}.{rank}")
        torch.testing.assert_close(got["mine"], got["want"], rtol=0, atol=0)
        assert got["layout_kept"]


def test_one_process_is_plain_indexing():
    x = _global_batch()[:B]
    perm = torch.tensor([2, 0, 3, 1])
    torch.testing.assert_close(take_global_rows(x, perm), x[perm], rtol=0, atol=0)
    with pytest.raises(ValueError, match="entries"):
        take_global_rows(x, torch.arange(3))
