"""The prefetcher: on a GPU the next batch's copies run on a side stream (tests/pretrain/engine/
test_gpu.py checks that on a GPU); on the CPU the loader's batches are handed over untouched."""

from __future__ import annotations

import torch

from pretrain.data.prefetch import DEVICE_KEYS, _tensors, _to, prefetch_to_device
from pretrain.utils.shuffle_plan import ShufflePlan, shuffle_plan


def test_on_the_cpu_the_loader_is_used_as_it_is():
    loader = [{"views": [1], "seeds": [2]}]
    assert prefetch_to_device(loader, "cpu") is loader


def test_only_what_the_step_reads_on_the_device_is_moved():
    """The views, colour parameters and ShuffleBN's plans; the sample seeds (the colour draw's
    generator), indices and file names stay on the host."""
    assert DEVICE_KEYS == ("views", "color_params", "shuffle_plans")


def test_a_shuffle_plan_travels_as_a_plan():
    """Moved as a plan (its table copied), its table marked as in use by the step's stream."""
    plan = shuffle_plan(0, 2, 4, 2, rank=1)
    (moved,) = _to([plan], torch.device("cpu"))
    assert isinstance(moved, ShufflePlan) and torch.equal(moved.table, plan.table)
    assert [t is plan.table for t in _tensors([plan])] == [True]
