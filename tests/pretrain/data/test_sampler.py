"""The iteration-keyed batch sampler: deterministic, resumable, rank-consistent."""

from itertools import islice

import pytest

from pretrain.data.sampler import IterationBatchSampler


def _take(s, n):
    return list(islice(iter(s), n))


def test_resume_at_iteration_t_yields_the_same_batches():
    full = _take(IterationBatchSampler(50, 8, 0, 1, seed=3, start_iter=0), 14)
    resumed = _take(IterationBatchSampler(50, 8, 0, 1, seed=3, start_iter=9), 5)
    assert resumed == full[9:]


def test_ranks_partition_the_global_batch_in_order():
    one = _take(IterationBatchSampler(40, 8, 0, 1, seed=1, start_iter=0), 6)
    r0 = _take(IterationBatchSampler(40, 8, 0, 2, seed=1, start_iter=0), 6)
    r1 = _take(IterationBatchSampler(40, 8, 1, 2, seed=1, start_iter=0), 6)
    assert [a + b for a, b in zip(r0, r1, strict=True)] == one


def test_each_epoch_visits_every_image_once_and_seeds_differ():
    batches = _take(IterationBatchSampler(32, 8, 0, 1, seed=0, start_iter=0), 8)
    epoch0 = [i for b in batches[:4] for i, _ in b]
    assert sorted(epoch0) == list(range(32))
    assert [i for b in batches[4:] for i, _ in b] != epoch0  # reshuffled
    seeds = [s for b in batches for _, s in b]
    assert len(set(seeds)) == len(seeds)


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        IterationBatchSampler(5, 8, 0, 1, seed=0, start_iter=0)
