"""The prefetcher: on a GPU the next batch's copies run on a side stream, its views, colour
parameters and ShuffleBN plans (tests/pretrain/engine/test_gpu.py checks that on a GPU); on the
CPU the loader's batches are handed over untouched."""

from __future__ import annotations

from pretrain.data.prefetch import DEVICE_KEYS, prefetch_to_device


def test_on_the_cpu_the_loader_is_used_as_it_is():
    loader = [{"views": [1], "seeds": [2]}]
    assert prefetch_to_device(loader, "cpu") is loader


def test_only_what_the_step_reads_on_the_device_is_moved():
    """The views, colour parameters and ShuffleBN's plans; the sample seeds (the colour draw's
    generator), indices and file names stay on the host."""
    assert DEVICE_KEYS == ("views", "color_params", "shuffle_plans")
