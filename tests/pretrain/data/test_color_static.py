"""The colour augmentation's mask pick (``pick="mask"``): what a CUDA graph replay or
``torch.compile`` needs (one op sequence whatever the draw, no host sync, one graph), the subset
pick's result within float rounding, and the samples an op does not pick kept bit for bit. Its
agreement with torchvision is checked in ``test_transforms.py`` (parametrized over the picks).
Also ``ColorParams.pin_memory`` for the DataLoader's pin-memory thread."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data._utils.pin_memory import pin_memory as loader_pin_memory

from pretrain.data.color import (
    BatchColorAugment,
    Blur,
    ColorOp,
    ColorParams,
    ColorSpec,
    Grayscale,
    Jitter,
    Pick,
    apply_color_params,
    blur_radius,
    sample_color_params,
)
from tests.helpers.dispatch import OpRecorder

SOME = ColorSpec()
NONE = ColorSpec().replace(Jitter(prob=0.0), Grayscale(0.0), Blur(prob=0.0))
ALL = ColorSpec().replace(Jitter(prob=1.0), Grayscale(1.0), Blur(prob=1.0))
# No saturation: no jitter slot needs the gray plane, so the subset pick takes its contrast
# mean from the channel means (another rounding than the mask pick's gray-plane mean).
NO_SATURATION = ColorSpec().replace(Jitter((0.4, 0.4, 0.0, 0.1)))
# Ops that read a tensor on the host: the device would wait for the queue to drain.
HOST_READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.unique", "aten.masked_select")


def uint8_views(seed: int, n: int = 4, sizes=((24, 3), (12, 2), (6, 1))) -> list[torch.Tensor]:
    """``count`` uint8 (n, 3, size, size) views per (size, count); at 6 the blur's kernel is
    clamped by the view size (reflect padding)."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        for size, count in sizes
        for _ in range(count)
    ]


def images(n: int, side: int = 16, seed: int = 0) -> torch.Tensor:
    """Float (n, 3, side, side) images in [0, 1] on 8-bit levels."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, side, side), generator=g).float() / 255


def recorded_ops(drawn_by: ColorSpec, seed: int, pick: str, one_pass: bool) -> list[tuple]:
    """Every op (with its arguments' shapes, strides and dtypes) of one call of the augmentation
    of ``SOME`` on parameters drawn by ``drawn_by`` (as the loader's workers give them)."""
    views = uint8_views(seed)
    g = torch.Generator().manual_seed(seed)
    params = [sample_color_params(len(v), drawn_by, g) for v in views]
    aug = BatchColorAugment(SOME, cpu_chunk_pixels=24 * 24 * 2, one_pass=one_pass, pick=pick)
    aug(views, None, params=params)  # a warm-up call (as before a capture): constants copied once
    with OpRecorder() as rec:
        aug(views, None, params=params)
    return rec.ops


@pytest.mark.parametrize("one_pass", [False, True])
def test_mask_pick_runs_the_same_ops_whatever_the_draw(one_pass):
    """Proves a graph captured on one draw replays any other: two seeds, a draw that picks no
    sample for any op and one that picks every sample give the same op sequence (names, shapes,
    strides, dtypes, scalar arguments), with no op that reads a tensor on the host."""
    first = recorded_ops(SOME, 0, "mask", one_pass)
    for drawn_by, seed in [(SOME, 1), (NONE, 2), (ALL, 3)]:
        assert recorded_ops(drawn_by, seed, "mask", one_pass) == first
    names = {op[0].rsplit(".", 1)[0] for op in first}
    assert not names & set(HOST_READS)
    # The recorder sees what the subset pick decides from the values: subsets, host reads.
    default = recorded_ops(SOME, 0, "subset", one_pass)
    assert recorded_ops(SOME, 1, "subset", one_pass) != default
    assert {op[0].rsplit(".", 1)[0] for op in default} & set(HOST_READS)


@pytest.mark.parametrize("spec", [SOME, NO_SATURATION, ALL], ids=["some", "no-sat", "all"])
@pytest.mark.parametrize("one_pass", [False, True])
def test_mask_pick_equals_the_subset_pick_within_rounding(spec, one_pass):
    """Same draws, same result up to float rounding, in both layouts. Measured over 100 seeds
    (batch 8, views of 32 and 16): at most 5.6e-6 on the normalised float32 views (about 25 ulp
    of values near 2.5, 1.3e-6 before the division by the std): the subset pick computes a
    contrast mean from the channel means when no sample of a slot needs the gray plane, and
    normalises its taps without the zero padding; jitter factors up to 1.8 amplify the
    difference through the slots that follow."""
    for seed in range(3):
        views = uint8_views(seed)
        kwargs = {"cpu_chunk_pixels": 24 * 24 * 2, "one_pass": one_pass}
        default = BatchColorAugment(spec, **kwargs)(views, torch.Generator().manual_seed(seed))
        masked = BatchColorAugment(spec, pick="mask", **kwargs)(
            views, torch.Generator().manual_seed(seed)
        )
        for d, s in zip(default, masked, strict=True):
            assert s.dtype == torch.float32 and s.shape == d.shape
            torch.testing.assert_close(s, d, rtol=0, atol=2e-5)


@pytest.mark.parametrize("group_by_size", [True, False], ids=["shifted-sums", "conv"])
@pytest.mark.parametrize("op", [Jitter(prob=0.5), Grayscale(0.5), Blur(prob=0.5)])
def test_samples_an_op_does_not_pick_keep_their_bits(op, group_by_size):
    """Selection by ``torch.where``, not a multiplication by 1 through a conv or a matmul that
    autocast may run in bfloat16: the samples an op does not pick are their input bit for bit,
    under CPU bfloat16 autocast too, and a draw that picks none leaves the batch as it was."""
    x = images(16, seed=1)
    spec = NONE.replace(op)
    params = sample_color_params(16, spec, torch.Generator().manual_seed(2))
    picked = params.tensors[op.names[0]]
    assert 0 < int(picked.sum()) < 16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = apply_color_params(x.clone(), params, spec, group_by_size, pick="mask")
    assert y.dtype == torch.float32
    assert torch.equal(y[~picked], x[~picked])
    assert bool((y[picked] != x[picked]).flatten(1).any(1).all())
    params = sample_color_params(16, NONE, torch.Generator().manual_seed(2))
    y = apply_color_params(x.clone(), params, NONE, group_by_size, pick="mask")
    assert torch.equal(y, x)


def test_mask_pick_augmentation_is_one_graph():
    """``torch._dynamo.explain`` of the mask-pick augmentation, parameters already on the device:
    one graph, no break (no host read, no data-dependent shape), for both blur forms and for the
    whole one-pass call (uint8 views in, normalised views out)."""
    x = images(4)
    params = sample_color_params(4, SOME, torch.Generator().manual_seed(0))
    for group_by_size in (True, False):
        torch.compiler.reset()
        explained = torch._dynamo.explain(
            lambda x, p, g=group_by_size: apply_color_params(x, p, SOME, g, pick="mask")
        )(x.clone(), params)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    views = uint8_views(0, n=2, sizes=((16, 2), (8, 1)))
    per_view = [sample_color_params(2, SOME, torch.Generator().manual_seed(i)) for i in range(3)]
    aug = BatchColorAugment(SOME, one_pass=True, pick="mask")
    torch.compiler.reset()
    explained = torch._dynamo.explain(lambda v, p: aug(v, None, params=p))(views, per_view)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    torch.compiler.reset()


@pytest.mark.parametrize("sigma", [(0.1, 2.0), (0.1, 0.5), (0.2, 0.7), (0.5, 1.0), (1 / 3, 1 / 3)])
def test_mask_pick_blur_kernel_is_the_largest_the_op_draws(sigma):
    op = Blur(sigma)
    u = torch.rand(20000, 2, generator=torch.Generator().manual_seed(0))
    u[0] = 1.0 - 2.0**-24  # torch.rand's largest value
    assert op.max_radius == int(blur_radius(op.sample(u)["sigma"], 10**6, 10**6).max())
    assert op == Blur(sigma) and "max_radius" not in repr(op)  # derived, not a setting


def test_an_op_without_apply_says_so():
    with pytest.raises(NotImplementedError, match="ColorOp does not implement apply"):
        ColorOp().apply(images(2), sample_color_params(2, SOME), "mask", True)


def test_an_unknown_pick_is_refused():
    params = sample_color_params(2, SOME)
    with pytest.raises(ValueError, match="pick must be one of"):
        apply_color_params(images(2), params, SOME, pick="static")
    with pytest.raises(ValueError, match="pick must be one of"):
        BatchColorAugment(SOME, pick="masks")


def test_a_pick_missing_part_of_the_contract_cannot_be_made():
    class HostOnly(Pick):  # no blur_
        params = jitter_terms = select_ = lambda *a: None

    with pytest.raises(TypeError, match="abstract method.* blur_"):
        HostOnly()


def test_the_loader_pins_color_params(monkeypatch):
    """The DataLoader's pin-memory thread pins the colour parameters of a batch (it calls
    ``pin_memory()`` on objects that have it); without CUDA, ``Tensor.pin_memory`` is mocked."""
    pinned: list[torch.Tensor] = []

    def fake_pin(t: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        pinned.append(t)
        return t.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    params = [sample_color_params(3, SOME, torch.Generator().manual_seed(i)) for i in range(2)]
    batch = {"views": [torch.zeros(3, 3, 4, 4, dtype=torch.uint8)] * 2, "color_params": params}
    out = loader_pin_memory(batch)
    for before, after in zip(params, out["color_params"], strict=True):
        assert isinstance(after, ColorParams) and after is not before and len(after) == 3
        assert list(after.tensors) == list(before.tensors)
        for name, t in before.tensors.items():
            assert any(p is t for p in pinned)
            assert torch.equal(after.tensors[name], t) and after.tensors[name] is not t


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_color_params_pin_memory_and_mask_pick_on_cuda():
    params = sample_color_params(8, SOME, torch.Generator().manual_seed(0))
    pinned = params.pin_memory()
    assert all(t.is_pinned() for t in pinned.tensors.values())
    assert all(torch.equal(pinned.tensors[k], t) for k, t in params.tensors.items())
    on_gpu = pinned.to("cuda")
    assert all(t.is_cuda for t in on_gpu.tensors.values())
    x = images(8).cuda()
    y = apply_color_params(x.clone(), on_gpu, SOME, pick="mask")
    ref = apply_color_params(x.clone(), params, SOME)
    torch.testing.assert_close(y, ref, rtol=0, atol=2e-5)
