"""The step counter (:mod:`pretrain.diagnostics.op_counter`) sees what a GPU would do inside ops:
the syncs Python never asks for, none where the GPU makes none, and collectives whose layouts
differ."""

from __future__ import annotations

import pytest
import torch

from pretrain.diagnostics.op_counter import StepCounter


def _count(fn, *device_tensors):
    counter = StepCounter()
    counter.mark(list(device_tensors))
    with counter:
        fn()
    return counter


@pytest.mark.parametrize(
    ("name", "fn", "syncs"),
    [
        ("eigh's error check", lambda x, i: torch.linalg.eigh(x[0] @ x[0].T), 1),
        ("eigvalsh's error check", lambda x, i: torch.linalg.eigvalsh(x[0] @ x[0].T), 1),
        ("svdvals' error check", lambda x, i: torch.linalg.svdvals(x[0]), 1),
        (
            "cholesky_ex checked",
            lambda x, i: torch.linalg.cholesky_ex(x[0] @ x[0].T, check_errors=True),
            1,
        ),
        ("cholesky_ex unchecked", lambda x, i: torch.linalg.cholesky_ex(x[0] @ x[0].T), 0),
        ("a Python list as index", lambda x, i: x[[0, 2]], 1),
        ("a boolean mask", lambda x, i: x[x[:, 0, 0] > 0], 1),
        ("a device index", lambda x, i: x[i], 0),
        ("index_select with a device index", lambda x, i: x.index_select(0, i), 0),
        ("a slice", lambda x, i: x[1:3] * 2, 0),
        ("a blocking copy to the device", lambda x, i: torch.arange(4).to(x.device), 1),
        ("a non-blocking copy", lambda x, i: torch.arange(4).to(x.device, non_blocking=True), 0),
        ("a scalar copy", lambda x, i: torch.tensor(3.0).to(x.device), 1),
        ("item assignment", lambda x, i: x[0, 0, 0].__setitem__((), 5.0), 1),
        ("fill_", lambda x, i: x[0, 0, 0].fill_(5.0), 0),
        ("tensor(data, device=)", lambda x, i: torch.tensor([1.0, 2.0], device=x.device), 1),
        ("tolist", lambda x, i: x[0, 0].tolist(), 1),
        (".item()", lambda x, i: x[0, 0, 0].item(), 1),
    ],
)
def test_the_counter_sees_the_syncs_a_gpu_makes_inside_ops(name, fn, syncs):
    """Syncs Python never asks for: linalg error checks, host index tensors, boolean masks,
    blocking host-to-device copies; and none where the GPU makes none."""
    x = torch.randn(4, 3, 3)
    index = torch.tensor([0, 2])
    counter = _count(lambda: fn(x, index), x, index)
    assert sum(counter.syncs.values()) == syncs, (name, dict(counter.syncs))


def test_the_counter_flags_a_collective_with_mixed_layouts(tmp_path):
    """One gloo process: all_gather of a channels_last tensor into NCHW buffers is reported,
    the same gather into buffers of its own layout is not."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
        mixed = _count(lambda: dist.all_gather([torch.empty(2, 3, 4, 4)], x))
        same = _count(lambda: dist.all_gather([torch.empty_like(x)], x))
    finally:
        dist.destroy_process_group()
    assert len(mixed.layout_mismatches) == 1 and "channels_last" in mixed.layout_mismatches[0]
    assert same.layout_mismatches == []
    assert same.collective_bytes == same.collective_bytes_received == x.numel() * 4
