"""Multi-crop views (pretrain.data.transforms) and batched colour augmentation (.color).

Checked against torchvision: crop sampling and crop pixels, every colour op, and the random-order
composition; and the worker-side path (``color_on_device=False``) against the batched path on
the statistics of ~2000 views.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.transforms import RandomResizedCrop

from pretrain.data.color import (
    PICKS,
    BatchColorAugment,
    Blur,
    ColorParams,
    ColorSpec,
    Grayscale,
    Jitter,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    apply_color_params,
    blur_radius,
    gaussian_blur,
    rgb_to_grayscale,
    sample_color_params,
)
from pretrain.data.transforms import (
    CropSpec,
    MultiCropTransform,
    image_to_tensor,
    mocov2_specs,
    multicrop_specs,
    sample_crop_boxes,
)
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB

MEAN = torch.tensor(IMAGENET_MEAN_RGB).view(1, 3, 1, 1)
STD = torch.tensor(IMAGENET_STD_RGB).view(1, 3, 1, 1)


def colorful_image(width: int = 120, height: int = 90, seed: int = 0) -> Image.Image:
    """Smooth saturated colour field: every pixel has distinct R, G, B."""
    rng = np.random.default_rng(seed)
    low = rng.permuted(np.tile([20, 128, 235], (4, 5, 1)), axis=2).astype(np.uint8)
    return Image.fromarray(low).resize((width, height), Image.Resampling.BILINEAR)


def random_images(n: int, h: int = 20, w: int = 24, seed: int = 0) -> torch.Tensor:
    """Float (n, 3, h, w) images in [0, 1] with ties, grays, black and white pixels mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, h, w, generator=g)
    x = (x * 255).round() / 255  # 8-bit values make exact channel ties likely
    x[:, :, 0, :4] = x[:, :1, 0, :4]  # gray pixels
    x[:, 1, 1, :] = x[:, 0, 1, :]  # r == g
    x[:, 2, 2, :] = x[:, 1, 2, :]  # g == b
    x[:, :, 3, 0], x[:, :, 3, 1] = 0.0, 1.0
    return x


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run as in a data loader worker (torch uses 1 thread there): thousands of tiny ops, where
    extra threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def unnormalize(x: torch.Tensor) -> torch.Tensor:
    return x * STD.to(x.device) + MEAN.to(x.device)


# ---------------------------------------------------------------- specs, shapes, determinism


def test_spec_helpers_follow_the_paper():
    crops, color = multicrop_specs()
    assert [(c.size, c.scale, c.count, c.flip_prob) for c in crops] == [
        (224, (0.14, 1.0), 3, 0.5),
        (96, (0.05, 0.14), 5, 0.5),
    ]
    assert color == ColorSpec(
        (Jitter((0.8, 0.8, 0.8, 0.2), 0.8), Grayscale(0.2), Blur((0.1, 2.0), 0.5))
    )
    crops, color = mocov2_specs()
    assert [(c.size, c.scale, c.count) for c in crops] == [(224, (0.2, 1.0), 2)]
    assert color.op(Jitter) == Jitter((0.4, 0.4, 0.4, 0.1), 0.8)
    assert color.op(Grayscale).prob == 0.2 and color.op(Blur).prob == 0.5


@pytest.mark.parametrize(
    "bad",
    [
        lambda: CropSpec(0, (0.1, 1.0), 1),
        lambda: CropSpec(32, (0.5, 0.2), 1),
        lambda: CropSpec(32, (0.1, 1.5), 1),
        lambda: CropSpec(32, (0.1, 1.0), 0),
        lambda: CropSpec(32, (0.1, 1.0), 1, flip_prob=1.5),
        lambda: Jitter((0.4, 0.4, 0.4, 0.6)),
        lambda: Jitter(prob=-0.1),
        lambda: Grayscale(1.2),
        lambda: Blur((0.0, 2.0)),
        lambda: Blur(prob=1.5),
        lambda: ColorSpec((Grayscale(), Jitter(), Blur())),  # not the registry's order
        lambda: ColorSpec((Jitter(), Blur())),  # an op missing
    ],
)
def test_specs_reject_bad_values(bad):
    with pytest.raises(ValueError):
        bad()


@pytest.mark.parametrize("color_on_device", [True, False])
def test_views_have_spec_shapes_and_uint8(color_on_device):
    crops, color = multicrop_specs()
    transform = MultiCropTransform(crops, color, color_on_device=color_on_device)
    views = transform(colorful_image(300, 200), torch.Generator().manual_seed(0))
    assert transform.num_views == len(views) == 8
    assert [tuple(v.shape) for v in views] == [(3, 224, 224)] * 3 + [(3, 96, 96)] * 5
    assert all(v.dtype == torch.uint8 for v in views)


def test_views_accept_non_rgb_and_tiny_images():
    transform = MultiCropTransform([CropSpec(32, (0.05, 1.0), 2)], ColorSpec(), False)
    for img in [colorful_image(8, 6).convert("L"), colorful_image(500, 4)]:
        views = transform(img, torch.Generator().manual_seed(1))
        assert [tuple(v.shape) for v in views] == [(3, 32, 32)] * 2


@pytest.mark.parametrize("color_on_device", [True, False])
def test_same_seed_same_views_other_seed_other_views(color_on_device):
    transform = MultiCropTransform(
        [CropSpec(48, (0.14, 1.0), 3), CropSpec(24, (0.05, 0.14), 2)],
        ColorSpec(),
        color_on_device=color_on_device,
    )
    img = colorful_image()
    a = transform(img, torch.Generator().manual_seed(7))
    b = transform(img, torch.Generator().manual_seed(7))
    c = transform(img, torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not any(torch.equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("pick", ["subset", "mask"])
def test_batch_color_is_reproducible_and_chunking_does_not_change_it(pick):
    views = [
        TF.to_dtype(random_images(12, 16, 16, seed=s), torch.uint8, scale=True) for s in (1, 2)
    ]
    color = ColorSpec()
    whole = BatchColorAugment(color, cpu_chunk_pixels=1 << 30, pick=pick)(
        views, torch.Generator().manual_seed(3)
    )
    chunked = BatchColorAugment(color, cpu_chunk_pixels=16 * 16 * 5, pick=pick)(
        views, torch.Generator().manual_seed(3)
    )
    other = BatchColorAugment(color, pick=pick)(views, torch.Generator().manual_seed(4))
    for w, c, o in zip(whole, chunked, other, strict=True):
        assert w.dtype == torch.float32 and w.shape == c.shape
        torch.testing.assert_close(w, c, rtol=0, atol=1e-5)  # vector tails round differently
        assert not torch.allclose(w, o)


# ---------------------------------------------------------------- crop geometry


@pytest.mark.parametrize(
    "size, scale, ratio",
    [((500, 375), (0.14, 1.0), (3 / 4, 4 / 3)), ((375, 500), (0.05, 0.14), (3 / 4, 4 / 3))],
)
def test_crop_boxes_stay_in_range_and_match_torchvision(size, scale, ratio):
    width, height = size
    n = 4000
    boxes = torch.tensor(sample_crop_boxes(width, height, scale, ratio, n, torch.Generator()))
    top, left, h, w = boxes.T.double()
    assert bool((top >= 0).all() and (left >= 0).all())
    assert bool((top + h <= height).all() and (left + w <= width).all())
    # Sides are rounded, so area and ratio may leave the range by the rounding only.
    frac = h * w / (width * height)
    slack = (1 + 0.5 / h) * (1 + 0.5 / w)
    assert bool((frac >= scale[0] / slack).all() and (frac <= scale[1] * slack).all())
    aspect = w / h
    assert bool((aspect >= ratio[0] / slack**2).all() and (aspect <= ratio[1] * slack**2).all())
    # The whole range is used, with torchvision's distribution (two-sample KS at alpha=1e-3).
    torch.manual_seed(0)
    img = Image.new("RGB", (width, height))
    ref = torch.tensor([RandomResizedCrop.get_params(img, scale, ratio) for _ in range(n)])
    ref_frac = ref[:, 2].double() * ref[:, 3] / (width * height)
    assert ks_statistic(frac, ref_frac) < 1.95 * math.sqrt(2 / n)
    assert ks_statistic(aspect, ref[:, 3].double() / ref[:, 2]) < 1.95 * math.sqrt(2 / n)
    assert ks_statistic(left / (width - w + 1), ref[:, 1] / (width - ref[:, 3] + 1.0)) < 0.05


def test_crop_boxes_fall_back_to_a_central_crop():
    # No 0.9-area crop of a 400x10 image has a ratio in [3/4, 4/3]: torchvision's fallback.
    boxes = sample_crop_boxes(400, 10, (0.9, 1.0), (3 / 4, 4 / 3), 3, torch.Generator())
    assert boxes == [(0, 193, 10, 13)] * 3


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    a, b = a.double().sort().values, b.double().sort().values
    grid = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, grid, right=True) / len(a)
    cdf_b = torch.searchsorted(b, grid, right=True) / len(b)
    return float((cdf_a - cdf_b).abs().max())


def interpolate_crop(image: torch.Tensor, box, size: int, flip: bool = False) -> torch.Tensor:
    """The crop + resize the transform used to write by hand: torch's bilinear antialiased
    uint8 kernel on the crop window of a (1, 3, H, W) image."""
    top, left, h, w = box
    out = torch.nn.functional.interpolate(
        image[:, :, top : top + h, left : left + w],
        size=(size, size),
        mode="bilinear",
        antialias=True,
        align_corners=False,
    )[0]
    return (out.flip(-1) if flip else out).contiguous()


def test_views_are_unchanged_by_torchvision_resized_crop():
    """Proves the views (now torchvision's v2 ``resized_crop``) equal, pixel for pixel, those of
    the former hand-written crop + interpolate on a random image, for the same generator: same
    boxes, flips and pixels, contiguous uint8."""
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (150, 200, 3), dtype=np.uint8))
    crops = [CropSpec(64, (0.14, 1.0), 3), CropSpec(24, (0.05, 0.14), 5), CropSpec(150, (1, 1), 1)]
    transform = MultiCropTransform(crops, ColorSpec(), color_on_device=True)
    image = image_to_tensor(img)
    for seed in range(5):
        views = transform(img, torch.Generator().manual_seed(seed))
        g = torch.Generator().manual_seed(seed)
        expected = []
        for spec in crops:
            boxes = sample_crop_boxes(200, 150, spec.scale, spec.ratio, spec.count, g)
            flips = torch.rand(spec.count, generator=g) < spec.flip_prob
            expected += [
                interpolate_crop(image, box, spec.size, flip)
                for box, flip in zip(boxes, flips.tolist(), strict=True)
            ]
        assert len(views) == len(expected) == 9
        for view, ref in zip(views, expected, strict=True):
            assert view.dtype == torch.uint8 and view.is_contiguous()
            assert torch.equal(view, ref)


def test_crop_pixels_equal_torchvision_resized_crop():
    """The former hand-written crop equals torchvision's ``resized_crop`` on a plain CHW tensor
    too, and PIL's own bilinear resize differs from it by rounding only."""
    img = colorful_image(200, 150)
    image = image_to_tensor(img)
    for box, size in [((10, 20, 100, 130), 64), ((0, 0, 150, 200), 96), ((50, 60, 20, 25), 40)]:
        ours = interpolate_crop(image, box, size)
        ref = TF.resized_crop(TF.pil_to_tensor(img), *box, [size, size], antialias=True)
        assert torch.equal(ours, ref)
        assert torch.equal(interpolate_crop(image, box, size, flip=True), ref.flip(-1))
        pil = TF.pil_to_tensor(TF.resized_crop(img, *box, [size, size], antialias=True))
        assert (ours.float() - pil.float()).abs().mean() < 0.5


def coordinate_image(width: int = 256, height: int = 192) -> Image.Image:
    """R = x and G = y in pixels (exact in 8 bits for sides <= 256), B = 0."""
    x = np.broadcast_to(np.arange(width, dtype=np.uint8)[None, :], (height, width))
    y = np.broadcast_to(np.arange(height, dtype=np.uint8)[:, None], (height, width))
    return Image.fromarray(np.stack([x, y, np.zeros_like(x)], axis=-1))


def test_views_show_the_sampled_crop_region_and_flip_half_of_them():
    """Read each view's crop window back from the coordinates encoded in its pixels."""
    size, scale = 32, (0.05, 0.3)
    transform = MultiCropTransform([CropSpec(size, scale, 8)], ColorSpec(), color_on_device=True)
    img = coordinate_image()
    fracs, flips = [], []
    for seed in range(50):
        for v in transform(img, torch.Generator().manual_seed(seed)):
            r, g = v[0].double(), v[1].double()
            # Pixel centres of the first and last columns are half an output pixel inside the
            # crop: the edge-to-edge span is (last - first) * size / (size - 1).
            w = (r[:, -1] - r[:, 0]).mean().abs() * size / (size - 1)
            h = (g[-1, :] - g[0, :]).mean() * size / (size - 1)
            fracs.append(float(w * h) / (256 * 192))
            flips.append(bool(r[:, -1].mean() < r[:, 0].mean()))
    fracs = torch.tensor(fracs)
    assert fracs.min() > scale[0] * 0.8 and fracs.max() < scale[1] * 1.2
    assert fracs.min() < scale[0] * 1.3 and fracs.max() > scale[1] * 0.8  # the range is used
    assert abs(sum(flips) / len(flips) - 0.5) < 0.08  # 400 views


# ---------------------------------------------------------------- colour ops vs torchvision


def per_sample(fn, x, values, **kw):
    return torch.stack([fn(x[i], float(v), **kw) for i, v in enumerate(values)])


@pytest.mark.parametrize(
    "ours, ref, lo, hi",
    [
        (adjust_brightness, TF.adjust_brightness, 0.0, 2.0),
        (adjust_contrast, TF.adjust_contrast, 0.0, 2.0),
        (adjust_saturation, TF.adjust_saturation, 0.0, 2.0),
        (adjust_hue, TF.adjust_hue, -0.5, 0.5),
    ],
)
def test_jitter_ops_match_torchvision(ours, ref, lo, hi):
    x = random_images(16)
    factors = torch.linspace(lo, hi, 16)  # includes the ends: 0, 2, +-0.5
    torch.testing.assert_close(ours(x, factors), per_sample(ref, x, factors), rtol=0, atol=1e-5)


def test_grayscale_matches_torchvision():
    x = random_images(4)
    torch.testing.assert_close(rgb_to_grayscale(x), TF.rgb_to_grayscale(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("radius", [1, 3, 6])
def test_blur_matches_torchvision(radius):
    x = random_images(6, h=14, w=17)
    sigmas = torch.tensor([0.1, 0.3, 0.7, 1.0, 1.5, 2.0])
    ours = gaussian_blur(x, sigmas, radius)
    k = 2 * radius + 1
    ref = torch.stack(
        [TF.gaussian_blur(x[i], [k, k], [float(s)] * 2) for i, s in enumerate(sigmas)]
    )
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def reference_color(x: torch.Tensor, p: ColorParams) -> torch.Tensor:
    """The colour pipeline written plainly with torchvision, one sample at a time."""
    ops = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    out = []
    for i, img in enumerate(x):
        if p.jitter[i]:
            for op in p.order[i].tolist():
                img = ops[op](img, float(p.factors[i, op]))
        if p.grayscale[i]:
            img = TF.rgb_to_grayscale(img, num_output_channels=3)
        if p.blur[i]:
            k = 2 * int(blur_radius(p.sigma[i : i + 1], *img.shape[-2:])) + 1
            img = TF.gaussian_blur(img, [k, k], [float(p.sigma[i])] * 2)
        out.append(img)
    return torch.stack(out)


# The colour pipeline's modes: the subset pick (blur grouped by kernel size on the CPU) and the
# mask pick with each of its blur forms (shifted sums, depthwise convolutions).
MODES = {
    "subset": {},
    "mask-sums": {"group_blur_by_size": True, "pick": "mask"},
    "mask-conv": {"group_blur_by_size": False, "pick": "mask"},
}


@pytest.mark.parametrize("mode", MODES)
def test_random_order_pipeline_matches_torchvision_per_sample(mode):
    n = 64
    x = random_images(n, h=20, w=20, seed=5)
    params = sample_color_params(n, ColorSpec(), torch.Generator().manual_seed(0))
    assert 0 < int(params.jitter.sum()) < n and 0 < int(params.blur.sum()) < n
    assert 0 < int(params.grayscale.sum()) < n
    assert len({tuple(o) for o in params.order.tolist()}) > 12  # many op orders
    ours = apply_color_params(x.clone(), params, ColorSpec(), **MODES[mode])
    torch.testing.assert_close(ours, reference_color(x, params), rtol=0, atol=2e-5)


def test_color_params_follow_color_jitter_ranges():
    n = 20000
    spec = ColorSpec().replace(Jitter((0.8, 0.5, 1.5, 0.2)), Blur((0.1, 2.0)))
    p = sample_color_params(n, spec, torch.Generator().manual_seed(0))
    # ColorJitter: factors uniform on [max(0, 1 - s), 1 + s], hue uniform on [-h, h].
    for col, (lo, hi) in enumerate([(0.2, 1.8), (0.5, 1.5), (0.0, 2.5), (-0.2, 0.2)]):
        f = p.factors[:, col]
        assert f.min() >= lo and f.max() <= hi
        assert f.min() < lo + 0.01 * (hi - lo) and f.max() > hi - 0.01 * (hi - lo)
        assert abs(f.mean().item() - (lo + hi) / 2) < 0.02 * (hi - lo)
    assert p.sigma.min() >= 0.1 and p.sigma.max() <= 2.0
    assert abs(p.sigma.mean().item() - 1.05) < 0.02
    for mask, rate in [(p.jitter, 0.8), (p.grayscale, 0.2), (p.blur, 0.5)]:
        assert abs(mask.double().mean().item() - rate) < 0.015
    # Every op is equally likely in every slot (uniform permutations).
    assert all(sorted(o) == [0, 1, 2, 3] for o in p.order.tolist())
    counts = torch.stack([(p.order == op).double().mean(0) for op in range(4)])  # (op, slot)
    assert (counts - 0.25).abs().max() < 0.015


def blur_in_mode(x: torch.Tensor, mask: torch.Tensor, sigma: torch.Tensor, mode: str) -> None:
    """Blur the samples of x that ``mask`` picks, in place, as ``MODES[mode]`` does."""
    kw = {"pick": "subset", "group_blur_by_size": True, **MODES[mode]}
    params = ColorParams(len(x), {"blur": mask, "sigma": sigma})
    Blur().apply(x, params, PICKS[kw["pick"]], kw["group_blur_by_size"])


@pytest.mark.parametrize("mode", MODES)
def test_blur_by_kernel_size_groups_equals_one_zero_padded_pass(mode):
    # The CPU path runs each kernel size separately, the GPU path one pass with the largest;
    # the mask pick runs the largest size the spec draws on every sample, picked by the mask.
    x = random_images(40, h=16, w=16, seed=2)
    mask = torch.arange(40) % 3 != 0
    sigma = torch.linspace(0.1, 2.0, 40)
    ours, padded = x.clone(), x.clone()
    blur_in_mode(ours, mask, sigma, mode)
    Blur().apply(padded, ColorParams(40, {"blur": mask, "sigma": sigma}), PICKS["subset"], False)
    torch.testing.assert_close(ours, padded, rtol=0, atol=1e-6)
    assert torch.equal(ours[~mask], x[~mask]) and not torch.allclose(ours[mask], x[mask])
    k = [2 * int(blur_radius(s[None], 16, 16)) + 1 for s in sigma]
    ref = torch.stack(
        [TF.gaussian_blur(x[i], [k[i]] * 2, [float(sigma[i])] * 2) for i in range(40)]
    )
    torch.testing.assert_close(ours[mask], ref[mask], rtol=0, atol=1e-5)


def test_blur_kernel_size_is_three_sigma():
    sigma = torch.tensor([0.1, 0.34, 1.0, 2.0, 2.0])
    assert blur_radius(sigma, 100, 100).tolist() == [1, 2, 3, 6, 6]
    assert blur_radius(sigma, 5, 100).tolist() == [1, 2, 3, 4, 4]  # reflect padding < side


@pytest.mark.parametrize("pick", ["subset", "mask"])
def test_without_color_only_converts_and_normalizes(pick):
    v = TF.to_dtype(random_images(5), torch.uint8, scale=True)
    aug = BatchColorAugment(ColorSpec(), pick=pick)
    (out,) = aug([v], torch.Generator(), apply_color=False)
    ref = TF.normalize(
        TF.to_dtype(v, torch.float32, scale=True), IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
    )
    assert out.dtype == torch.float32 and out.shape == v.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pick", ["subset", "mask"])
def test_batch_color_rejects_float_views(pick):
    with pytest.raises(ValueError, match="uint8"):
        BatchColorAugment(ColorSpec(), pick=pick)([torch.rand(2, 3, 8, 8)], None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pick", ["subset", "mask"])
def test_cuda_matches_cpu(pick):
    views = [TF.to_dtype(random_images(16, 32, 32), torch.uint8, scale=True)]
    aug = BatchColorAugment(ColorSpec(), pick=pick)
    cpu = BatchColorAugment(ColorSpec())(views, torch.Generator().manual_seed(0))
    gpu = aug([v.cuda() for v in views], torch.Generator().manual_seed(0))
    assert gpu[0].device.type == "cuda"
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], rtol=0, atol=1e-4)


# ---------------------------------------------------------------- worker path vs batched path

N_IMAGES, VIEWS = 250, 8  # 2000 views per path


def batched_views(img: Image.Image, color: ColorSpec) -> torch.Tensor:
    """Float views in [0, 1] of ``img``: crops in the workers, colour batched."""
    transform = MultiCropTransform([CropSpec(24, (0.14, 1.0), VIEWS)], color, color_on_device=True)
    views = [v for s in range(N_IMAGES) for v in transform(img, torch.Generator().manual_seed(-s))]
    (out,) = BatchColorAugment(color)([torch.stack(views)], torch.Generator().manual_seed(1))
    return unnormalize(out).double()


def worker_views(img: Image.Image, color: ColorSpec) -> torch.Tensor:
    """Float views in [0, 1] of ``img``: crops and colour in the workers (uint8 out)."""
    transform = MultiCropTransform([CropSpec(24, (0.14, 1.0), VIEWS)], color, color_on_device=False)
    views = [v for s in range(N_IMAGES) for v in transform(img, torch.Generator().manual_seed(s))]
    return torch.stack(views).double() / 255


def views_both_paths(img: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
    return worker_views(img, ColorSpec()), batched_views(img, ColorSpec())


def assert_rate(hits: torch.Tensor, p: float) -> None:
    # 2000 Bernoulli draws: sd <= 0.011; 0.045 is over 4 sd.
    assert abs(hits.double().mean().item() - p) < 0.045, hits.double().mean().item()


def test_both_paths_grayscale_a_fifth_of_views():
    worker, batched = views_both_paths(colorful_image(64, 48))
    for views, tol in [(worker, 1.5 / 255), (batched, 1e-5)]:
        spread = (views.amax(dim=1) - views.amin(dim=1)).amax(dim=(1, 2))  # (N,)
        assert_rate(spread <= tol, 0.2)


def test_both_paths_jitter_four_fifths_with_torchvision_brightness_range():
    # On a uniform gray image only brightness changes pixels (contrast, saturation, hue,
    # grayscale and blur are identities), so the view's value over 128 is its brightness factor.
    worker, batched = views_both_paths(Image.new("RGB", (64, 48), (128, 128, 128)))
    factors = []
    for views in (worker, batched):
        factor = views.mean(dim=(1, 2, 3)) * 255 / 128
        jittered = (factor - 1).abs() > 1.5 / 128
        assert_rate(jittered, 0.8)
        f = factor[jittered]
        assert f.min() > 0.2 - 0.01 and f.max() < 1.8 + 0.01
        assert abs(f.mean().item() - 1.0) < 0.04  # uniform on [0.2, 1.8]: sd 0.46 / sqrt(1600)
        factors.append(f)
    assert ks_statistic(*factors) < 1.95 * math.sqrt(2 / 1600)


def stripes_image() -> Image.Image:
    """A gray left-to-right ramp with sharp 3-pixel stripes on top."""
    x = np.linspace(40, 110, 64)[None, :] + 25 * (np.arange(64) // 3 % 2)[None, :]
    return Image.fromarray(np.repeat(np.repeat(x, 48, 0)[..., None], 3, -1).astype(np.uint8))


def sharpness(views: torch.Tensor) -> torch.Tensor:
    """Mean horizontal edge strength relative to the view's own contrast, per view."""
    g = views[:, 0]
    edges = (g[:, :, 1:] - g[:, :, :-1]).abs().mean(dim=(1, 2))
    return edges / g.std(dim=(1, 2)).clamp_min(1e-3)


def test_both_paths_flip_half_and_blur_alike():
    # Every colour op keeps the stripes gray and keeps the ramp's direction, so the sign of the
    # left-right trend shows the flip and the relative edge strength shows the blur.
    worker, batched = views_both_paths(stripes_image())
    for views in (worker, batched):
        g = views[:, 0]
        assert_rate(g[:, :, :12].mean(dim=(1, 2)) > g[:, :, -12:].mean(dim=(1, 2)), 0.5)
    threshold = 1.95 * math.sqrt(2 / len(worker))  # two-sample KS at alpha = 1e-3
    assert ks_statistic(sharpness(worker), sharpness(batched)) < threshold
    # The statistic does see the blur: without it the distribution is far off.
    unblurred = batched_views(stripes_image(), ColorSpec().replace(Blur(prob=0.0)))
    assert ks_statistic(sharpness(batched), sharpness(unblurred)) > 3 * threshold
