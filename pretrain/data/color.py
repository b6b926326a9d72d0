"""Batched colour augmentation: jitter, grayscale and Gaussian blur, then normalisation.

The reference pipelines (SwAV, LORAC, MoCo-v2) run torchvision's ``ColorJitter``,
``RandomGrayscale`` and a PIL blur per image in the loader workers; here the same ops
(:data:`COLOR_OPS`, in draw and run order) run on whole batches of uint8 views on their device,
with one random draw per sample. Each equals ``torchvision.transforms.v2.functional`` on float
images up to float rounding (``tests/pretrain/data/test_transforms.py``). Departures, on purpose:

* The blur is an exact separable Gaussian (reflect padding) of ``2 * ceil(3 * sigma) + 1`` taps
  per sample (:func:`blur_radius`); the reference's PIL ``GaussianBlur(radius=sigma)`` is an
  iterated box-filter approximation of the same Gaussian.
* The ops run on float images in [0, 1], not rounded to uint8 between ops.

Parameters are drawn on the CPU from a ``torch.Generator`` (a seed fixes them whatever the
device). A :class:`Pick` (:data:`PICKS`) runs each op on host-chosen subsets (``"subset"``: no
device sync) or on the whole batch under a device mask (``"mask"``: for a CUDA graph or
``torch.compile``), with the same result up to float rounding.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from pretrain.utils.device import to_device
from pretrain.utils.errors import ConfigError
from pretrain.utils.pixels import normalize_

__all__ = [
    "COLOR_OPS",
    "BatchColorAugment",
    "Blur",
    "ColorOp",
    "ColorParams",
    "ColorSpec",
    "Grayscale",
    "Jitter",
    "PICKS",
    "Pick",
    "color_op",
    "GRAY_WEIGHTS",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "apply_color_params",
    "blur_radius",
    "gaussian_blur",
    "rgb_to_grayscale",
    "sample_color_params",
]

# torchvision's rgb_to_grayscale weights for float images (ITU-R 601-2 luma).
GRAY_WEIGHTS: tuple[float, float, float] = (0.2989, 0.587, 0.114)

# Op codes of the colour jitter; ``params.order[:, j]`` is the op run in slot j.
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3


class ColorParams:
    """Per-sample colour parameters of ``n`` samples: the tensors (n rows) each op's
    :meth:`ColorOp.sample` draws, by name, read as attributes (``params.sigma``)."""

    def __init__(self, n: int, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            if t.shape[0] != n:
                raise ValueError(f"{name}: {t.shape[0]} rows for {n} samples")
        self.n = n
        self.tensors = dict(tensors)

    def __len__(self) -> int:
        return self.n

    def __getattr__(self, name: str) -> torch.Tensor:
        # Only called for names that are not attributes (dunders too: pickling asks for them).
        if name.startswith("__") or name in ("n", "tensors"):
            raise AttributeError(name)
        try:
            return self.tensors[name]
        except KeyError:
            raise AttributeError(f"no colour parameter {name!r} ({list(self.tensors)})") from None

    @classmethod
    def cat(cls, parts: Sequence[ColorParams]) -> ColorParams:
        """The parameters of several batches, one after the other."""
        if len(parts) == 1:
            return parts[0]
        names = parts[0].tensors
        return cls(
            sum(len(p) for p in parts), {k: torch.cat([p.tensors[k] for p in parts]) for k in names}
        )

    def __getitem__(self, index: slice | torch.Tensor) -> ColorParams:
        """The parameters of a range of samples, or of the samples an index tensor lists."""
        n = len(range(self.n)[index]) if isinstance(index, slice) else len(index)
        return ColorParams(n, {k: t[index] for k, t in self.tensors.items()})

    def to(self, device: torch.device | str) -> ColorParams:
        """The parameters on ``device``, copied without a host sync."""
        return ColorParams(self.n, {k: to_device(t, device) for k, t in self.tensors.items()})

    def pin_memory(self) -> ColorParams:
        """The parameters in pinned host memory; the DataLoader's pin-memory thread calls it."""
        return ColorParams(self.n, {k: t.pin_memory() for k, t in self.tensors.items()})


class ColorOp:
    """One photometric op: a frozen dataclass of its settings, registered with :func:`color_op`,
    with its ``INPUT`` keys in ``pretrain/config/defaults.py``.

    ``config`` maps each setting to its ``INPUT`` key; :meth:`sample` turns its (n, width)
    uniforms into the tensors ``names``; :meth:`apply` changes float images (n, 3, h, w) in place
    from those alone, picking samples with ``pick`` (under :class:`Mask` nothing may depend on
    their values). A new op should draw no uniforms when off, so that the runs without it keep
    their random stream (``tests/golden``).
    """

    config: ClassVar[dict[str, str]] = {}
    names: ClassVar[tuple[str, ...]] = ()
    columns: ClassVar[int] = 0

    def width(self) -> int:
        return self.columns

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def apply(self, x: torch.Tensor, params: ColorParams, pick: Pick, group_by_size: bool) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement apply")

    @classmethod
    def from_cfg(cls, inp: Mapping[str, Any]) -> ColorOp:
        """The op with the settings of the ``INPUT`` config node ``inp``."""
        values = {f: tuple(inp[k]) if isinstance(inp[k], (list, tuple)) else inp[k]
                  for f, k in cls.config.items()}  # fmt: skip
        try:
            return cls(**values)
        except ValueError as e:
            keys = ", ".join(f"INPUT.{k}" for k in cls.config.values())
            raise ConfigError(f"{keys}: {e}") from None


COLOR_OPS: list[type[ColorOp]] = []  # in the order they draw and run

_Op = TypeVar("_Op", bound=type[ColorOp])
_T = TypeVar("_T", bound=ColorOp)
_Fn = Callable[[torch.Tensor, ColorParams], torch.Tensor]  # (picked images, their parameters)


def color_op(cls: _Op) -> _Op:
    """Register a :class:`ColorOp` subclass: it draws and runs after the ops registered before."""
    COLOR_OPS.append(cls)
    return cls


def _check_prob(op: ColorOp, name: str) -> None:
    p = getattr(op, name)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {p}")


@color_op
@dataclass(frozen=True)
class Jitter(ColorOp):
    """torchvision's ``ColorJitter(*strengths)`` with probability ``prob``, the four ops in a
    random order per sample; the defaults are the paper's (SwAV's distortion of strength 1)."""

    strengths: tuple[float, float, float, float] = (0.8, 0.8, 0.8, 0.2)
    prob: float = 0.8
    config = {"strengths": "COLOR_JITTER", "prob": "JITTER_PROB"}
    names = ("jitter", "factors", "order")
    columns = 9  # the factors (4), the order's sort keys (4), whether to jitter (1)

    def __post_init__(self) -> None:
        if len(self.strengths) != 4 or any(s < 0 for s in self.strengths):
            raise ValueError(f"jitter must be 4 non-negative strengths, got {self.strengths}")
        if self.strengths[3] > 0.5:
            raise ValueError(f"hue strength must be <= 0.5, got {self.strengths[3]}")
        _check_prob(self, "prob")

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        b, c, s, h = self.strengths
        lo = torch.tensor([max(0.0, 1.0 - b), max(0.0, 1.0 - c), max(0.0, 1.0 - s), -h])
        hi = torch.tensor([1.0 + b, 1.0 + c, 1.0 + s, h])
        return {
            "jitter": u[:, 8] < self.prob,
            "factors": lo + (hi - lo) * u[:, 0:4],  # (n, 4)
            "order": u[:, 4:8].argsort(dim=1),  # a uniform random permutation per sample
        }

    def apply(self, x: torch.Tensor, params: ColorParams, pick: Pick, group_by_size: bool) -> None:
        # Blend coefficients (3, n, 4) = (fx, fg, fm) per sample and slot (see _blend_): a slot
        # where a sample runs the hue (or no jitter) is x * 1 + 0, which leaves it bit-identical.
        f = params.factors
        op = torch.where(params.jitter[:, None], params.order, -1)  # (n, 4); -1: no jitter
        is_b, is_c, is_s = op == BRIGHTNESS, op == CONTRAST, op == SATURATION
        fx = torch.where(is_b, f[:, 0:1], torch.where(is_c, f[:, 1:2], 1.0))
        fx = torch.where(is_s, f[:, 2:3], fx)
        fg = torch.where(is_s, 1.0 - f[:, 2:3], 0.0)
        fm = torch.where(is_c, 1.0 - f[:, 1:2], 0.0)
        coef, is_hue = torch.stack([fx, fg, fm]), (op == HUE) & (f[:, 3:4] != 0)  # (n, 4) hue
        need = pick.jitter_terms(coef)
        coef = to_device(coef, x.device, x.dtype)  # one host-to-device copy (subset pick)
        for slot in range(4):
            scale, gray, mean = (need[t][slot] for t in range(3))
            if scale or gray or mean:
                fx, fg, fm = coef[:, :, slot].view(3, -1, 1, 1, 1)
                _blend_(x, fx, fg if gray else None, fm if mean else None)
            # The hue is by far the costliest op: only its samples, when the pick allows it.
            pick.select_(x, params, is_hue[:, slot], lambda xs, p: adjust_hue(xs, p.factors[:, 3]))


@color_op
@dataclass(frozen=True)
class Grayscale(ColorOp):
    """torchvision's ``RandomGrayscale(prob)`` (ITU-R 601 luma on all 3 channels)."""

    prob: float = 0.2
    config = {"prob": "GRAYSCALE_PROB"}
    names = ("grayscale",)
    columns = 1

    def __post_init__(self) -> None:
        _check_prob(self, "prob")

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"grayscale": u[:, 0] < self.prob}

    def apply(self, x: torch.Tensor, params: ColorParams, pick: Pick, group_by_size: bool) -> None:
        pick.select_(x, params, params.grayscale, lambda xs, p: rgb_to_grayscale(xs).expand_as(xs))


@color_op
@dataclass(frozen=True)
class Blur(ColorOp):
    """A Gaussian blur with probability ``prob`` (MoCo-v2's) and sigma uniform in ``sigma``."""

    sigma: tuple[float, float] = (0.1, 2.0)
    prob: float = 0.5
    # ceil(3 sigma) of the largest sigma the draw can give (float32, as blur_radius), before
    # the clamp to the view's size: the mask pick's one kernel size. Derived from ``sigma``.
    max_radius: int = field(init=False, repr=False, compare=False)
    config = {"sigma": "BLUR_SIGMA", "prob": "BLUR_PROB"}
    names = ("blur", "sigma")
    columns = 2  # whether to blur, sigma

    def __post_init__(self) -> None:
        lo, hi = self.sigma
        if not 0.0 < lo <= hi:
            raise ValueError(f"blur_sigma must satisfy 0 < min <= max, got {self.sigma}")
        _check_prob(self, "prob")
        # Computed here, not at apply time, so that the mask pick reads no tensor on the host.
        largest = self.sample(torch.full((1, 2), 1.0 - 2.0**-24))["sigma"]  # torch.rand's max
        object.__setattr__(self, "max_radius", int(torch.ceil(3.0 * largest).clamp_min(1)))

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        lo, hi = self.sigma
        return {"blur": u[:, 0] < self.prob, "sigma": lo + (hi - lo) * u[:, 1]}

    def apply(self, x: torch.Tensor, params: ColorParams, pick: Pick, group_by_size: bool) -> None:
        """Shifted sums per kernel size with ``group_by_size`` (the CPU's cost is the taps),
        otherwise depthwise convolutions (a GPU's cost is the launches)."""
        pick.blur_(x, params, self.max_radius, group_by_size)


@dataclass(frozen=True)
class ColorSpec:
    """The photometric ops of one view: one of each registered op, in the registry's order."""

    ops: tuple[ColorOp, ...] = field(default_factory=lambda: tuple(op() for op in COLOR_OPS))

    def __post_init__(self) -> None:
        kinds = [type(op) for op in self.ops]
        if kinds != COLOR_OPS:
            raise ValueError(
                f"a ColorSpec holds one of each colour op in the order "
                f"{[k.__name__ for k in COLOR_OPS]}, got {[k.__name__ for k in kinds]}"
            )

    @classmethod
    def from_cfg(cls, inp: Mapping[str, Any]) -> ColorSpec:
        """Every op with its settings from the ``INPUT`` config node ``inp``."""
        return cls(tuple(op.from_cfg(inp) for op in COLOR_OPS))

    def replace(self, *ops: ColorOp) -> ColorSpec:
        """This spec with ``ops`` in place of the ops of their kinds."""
        new = {type(op): op for op in ops}
        return ColorSpec(tuple(new.get(type(op), op) for op in self.ops))

    def op(self, kind: type[_T]) -> _T:
        """The op of kind ``kind`` (e.g. ``spec.op(Blur).prob``)."""
        return next(op for op in self.ops if isinstance(op, kind))


def sample_color_params(
    n: int, spec: ColorSpec, generator: torch.Generator | None = None
) -> ColorParams:
    """Draw the colour parameters of ``n`` samples on the CPU, in one draw split among the ops
    (the stream consumed per call is fixed, so seeds reproduce)."""
    widths = [op.width() for op in spec.ops]
    u = torch.rand(n, sum(widths), generator=generator)
    tensors: dict[str, torch.Tensor] = {}
    for op, cols in zip(spec.ops, u.split(widths, dim=1), strict=True):
        if cols.shape[1]:
            tensors.update(op.sample(cols))
    return ColorParams(n, tensors)


def _per_sample(values: torch.Tensor | Sequence[float] | float, x: torch.Tensor) -> torch.Tensor:
    """Per-sample scalars as an (n, 1, 1, 1) tensor on x's device and dtype."""
    t = to_device(torch.as_tensor(values, dtype=x.dtype), x.device)
    return t.expand(x.shape[0]).reshape(-1, 1, 1, 1)


def rgb_to_grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma of float RGB images: (n, 3, h, w) -> (n, 1, h, w), torchvision's weights."""
    r, g, b = x.unbind(dim=1)
    wr, wg, wb = GRAY_WEIGHTS
    return r.mul(wr).add_(g, alpha=wg).add_(b, alpha=wb).unsqueeze(1)


def _blend_(
    x: torch.Tensor,
    fx: torch.Tensor,
    fg: torch.Tensor | None,
    fm: torch.Tensor | None,
) -> torch.Tensor:
    """In place ``x <- clamp(fx * x + fg * gray(x) + fm * mean(gray(x)), 0, 1)`` per sample
    (n, 1, 1, 1): brightness, contrast and saturation in one pass; None terms are skipped."""
    if fg is not None:
        gray = rgb_to_grayscale(x)  # (n, 1, h, w)
        mean = gray.mean(dim=(2, 3), keepdim=True) if fm is not None else None
        base = gray.mul_(fg)
        if mean is not None:
            base.add_(mean.mul_(fm))
        return torch.addcmul(base, x, fx, out=x).clamp_(0.0, 1.0)
    if fm is not None:
        # The mean of the grayscale image from the channel means: one read pass, no plane.
        w = to_device(torch.tensor(GRAY_WEIGHTS, dtype=x.dtype), x.device)
        offset = (x.mean(dim=(2, 3)) @ w).view(-1, 1, 1, 1).mul_(fm)  # (n, 1, 1, 1)
        # Not addcmul: with a per-sample (not per-pixel) first operand its CPU kernel is ~5x
        # slower than these two passes.
        return x.mul_(fx).add_(offset).clamp_(0.0, 1.0)
    return x.mul_(fx).clamp_(0.0, 1.0)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``clamp(f * x)`` per sample; x is float (n, 3, h, w) in [0, 1], factor (n,) or scalar."""
    return _blend_(x.clone(), _per_sample(factor, x), None, None)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Blend each image with the mean of its grayscale version, per-sample factor."""
    f = _per_sample(factor, x)
    return _blend_(x.clone(), f, None, 1.0 - f)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Blend each image with its grayscale version, per-sample factor."""
    f = _per_sample(factor, x)
    return _blend_(x.clone(), f, 1.0 - f, None)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor | float) -> torch.Tensor:
    """Rotate the HSV hue of float RGB images by ``shift`` turns (per sample, in [-0.5, 0.5]).

    torchvision's ``adjust_hue`` up to float rounding, branch-free (masks and ``torch.where`` are
    several times slower on CPU): a rotation keeps each pixel's max and min, so only the hue H in
    sextants is computed and mapped back with the hexcone's ramps. Returns a (n, 3, h, w) view of
    (3, n, h, w) planes (``torch.compile`` cannot write a non-contiguous ``out=``).
    """
    out = x.new_empty((3, x.shape[0], *x.shape[2:]))  # (3, n, h, w)
    planes = out.unbind(0)
    r, g, b = x.unbind(dim=1)  # (n, h, w) each
    mx = torch.maximum(torch.maximum(r, g), b)
    mn = torch.minimum(torch.minimum(r, g), b)
    chroma = mx.sub_(mn)
    # Where max == min every numerator below is 0, so any non-zero divisor gives a valid hue.
    inv = chroma.clamp_min(torch.finfo(x.dtype).tiny).reciprocal_()
    # With r', g', b' = (channel - min) / chroma, H = 1 + g' + b' - r' when g >= b (H in [0, 3])
    # and H = 5 - (g' + b' - r') when g < b (H in [3, 6]); both meet continuously at g == b
    # (copysign(1, +0.0) = 1), so ties between channels need no special case.
    h = torch.add(g, b).sub_(r).sub_(mn).mul_(inv).sub_(2.0)
    h.mul_(torch.copysign(torch.ones((), dtype=x.dtype, device=x.device), g - b)).add_(3.0)
    h.add_(_per_sample(shift, x).view(-1, 1, 1), alpha=6.0)  # in [-3, 9]
    h.sub_(torch.floor(h * (1.0 / 6.0)).mul_(6.0))  # mod 6 -> [0, 6)
    # HSV -> RGB: channel = min + chroma * w(H), with the hexcone ramps (clamped to [0, 1])
    # w_R = |H - 3| - 1, w_G = min(|H - 5| - 1, H), w_B = min(|H - 1| - 1, 6 - H).
    w = torch.sub(h, 3.0).abs_().sub_(1.0).clamp_(0.0, 1.0)
    torch.addcmul(mn, chroma, w, out=planes[0])
    w = torch.sub(h, 5.0).abs_().sub_(1.0)
    torch.minimum(w, h, out=w).clamp_(0.0, 1.0)
    torch.addcmul(mn, chroma, w, out=planes[1])
    w = torch.sub(h, 1.0).abs_().sub_(1.0)
    torch.minimum(w, torch.rsub(h, 6.0), out=w).clamp_(0.0, 1.0)
    torch.addcmul(mn, chroma, w, out=planes[2])
    return out.transpose(0, 1)


def blur_radius(sigma: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Kernel half-width per sample: ceil(3 sigma) (99.7% of the Gaussian's mass), at least 1,
    below the image side (reflect padding needs it; tiny views only)."""
    return torch.ceil(3.0 * sigma).clamp(1, min(height, width) - 1).long()


def _gaussian_taps(
    sigma: torch.Tensor, radius: int, cutoff: torch.Tensor | None = None
) -> torch.Tensor:
    """Normalised 1-D Gaussian taps, (n,) float64 sigma -> (n, 2 * radius + 1); taps further
    than ``cutoff`` (per sample) are 0: a smaller kernel inside a larger one."""
    d = torch.arange(-radius, radius + 1, dtype=sigma.dtype, device=sigma.device)
    # The clamp keeps tiny taps at exactly 0 instead of float32 denormals, which are slow.
    taps = torch.exp((-0.5 * (d / sigma[:, None]) ** 2).clamp_min_(-80.0))  # (n, k)
    if cutoff is not None:
        taps = taps * (d.abs() <= cutoff[:, None])
    return taps / taps.sum(dim=1, keepdim=True)


def _separable_blur(
    x: torch.Tensor, taps: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Blur (n, 3, h, w) rows then columns with per-sample taps (n, 2r + 1), reflect padding."""
    n, _, h, w = x.shape
    radius = (taps.shape[1] - 1) // 2
    taps = to_device(taps, x.device, x.dtype).view(n, 1, 1, -1)  # (n, 1, 1, k)
    # Multiply-accumulate of shifted slices: a grouped conv2d with per-sample kernels is several
    # times slower on CPU, and this is a handful of fused elementwise kernels on GPU.
    xp = F.pad(x, (radius, radius, 0, 0), mode="reflect")  # (n, 3, h, w + 2r)
    acc = xp[..., 0:w] * taps[..., 0:1]
    for k in range(1, 2 * radius + 1):
        acc.addcmul_(xp[..., k : k + w], taps[..., k : k + 1])
    xp = F.pad(acc, (0, 0, radius, radius), mode="reflect")  # (n, 3, h + 2r, w)
    out = torch.mul(xp[:, :, 0:h], taps[..., 0:1], out=out)
    for k in range(1, 2 * radius + 1):
        out.addcmul_(xp[:, :, k : k + h], taps[..., k : k + 1])
    return out


def _separable_blur_conv(x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """:func:`_separable_blur` as two depthwise convolutions (one GPU launch per pass, not one
    per tap); float32 even under autocast."""
    n, c, h, w = x.shape
    radius = (taps.shape[1] - 1) // 2
    with torch.autocast(x.device.type, enabled=False):
        weight = to_device(taps, x.device, x.dtype).repeat_interleave(c, 0)  # (nc, k)
        xp = F.pad(x, (radius, radius, 0, 0), mode="reflect").reshape(1, n * c, h, -1)
        y = F.conv2d(xp, weight.view(n * c, 1, 1, -1), groups=n * c).view(n, c, h, w)
        yp = F.pad(y, (0, 0, radius, radius), mode="reflect").reshape(1, n * c, -1, w)
        return F.conv2d(yp, weight.view(n * c, 1, -1, 1), groups=n * c).view(n, c, h, w)


def gaussian_blur(
    x: torch.Tensor,
    sigma: torch.Tensor | float,
    radius: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """torchvision's ``gaussian_blur(x, 2 * radius + 1, sigma)`` with a per-sample sigma, up to
    float rounding; x is float (n, 3, h, w) with h, w > radius, ``out`` must not overlap it."""
    sig = torch.as_tensor(sigma, dtype=torch.float64).expand(x.shape[0])
    return _separable_blur(x, _gaussian_taps(sig, radius), out)


class Pick(abc.ABC):
    """How the colour ops pick the samples they change (:data:`PICKS`, chosen by the step's
    policy). Every pick keeps the bits of a sample an op does not draw and gives the drawn ones
    the same images up to float rounding; picks differ in the work they run: the drawn samples'
    only (picked on the host, shapes vary) or the whole batch's (the same ops every step)."""

    @abc.abstractmethod
    def params(self, params: ColorParams, device: torch.device) -> ColorParams:
        """The parameters the ops read: on the host or on ``device``."""

    @abc.abstractmethod
    def jitter_terms(self, coef: torch.Tensor) -> list[list[bool]]:
        """Which blend terms (3, 4) of ``coef`` (3, n, 4) to run: at least those not x * 1 + 0."""

    @abc.abstractmethod
    def select_(self, x: torch.Tensor, params: ColorParams, mask: torch.Tensor, fn: _Fn) -> None:
        """``x[i] <- fn(x, params)[i]`` in place where ``mask`` (n,) holds, the others kept."""

    @abc.abstractmethod
    def blur_(self, x: torch.Tensor, params: ColorParams, max_radius: int, grouped: bool) -> None:
        """The blur of the samples ``params.blur`` draws, in place (:meth:`Blur.apply`)."""


class Subset(Pick):
    """``fn`` runs on the rows picked on the host only: the least work, shapes vary."""

    def params(self, params: ColorParams, device: torch.device) -> ColorParams:
        return params

    def jitter_terms(self, coef: torch.Tensor) -> list[list[bool]]:  # those not x * 1 + 0
        return (coef != coef.new_tensor([1.0, 0.0, 0.0]).view(3, 1, 1)).any(1).tolist()

    def select_(self, x: torch.Tensor, params: ColorParams, mask: torch.Tensor, fn: _Fn) -> None:
        idx = mask.nonzero().squeeze(1)
        if 0 < idx.numel() < x.shape[0]:
            self._rows_(x, params, idx, fn)
        elif idx.numel():
            x.copy_(fn(x, params))

    def _rows_(self, x: torch.Tensor, params: ColorParams, idx: torch.Tensor, fn: _Fn) -> None:
        rows = params[idx]  # indexed by the host index (on a CPU, to_device returns idx itself)
        idx_dev = to_device(idx, x.device)
        x.index_copy_(0, idx_dev, fn(x.index_select(0, idx_dev), rows))

    def blur_(self, x: torch.Tensor, params: ColorParams, max_radius: int, grouped: bool) -> None:
        def blur(xs: torch.Tensor, p: ColorParams) -> torch.Tensor:
            radii, sigma = blur_radius(p.sigma, *xs.shape[-2:]), p.sigma.double()
            if not grouped:  # one pass, the largest picked size
                return _separable_blur_conv(xs, _gaussian_taps(sigma, int(radii.max()), radii))
            out = torch.empty_like(xs)
            sizes, counts = radii.unique_consecutive(return_counts=True)  # one slice per size
            parts = zip(*(t.split(counts.tolist()) for t in (xs, sigma, out)), strict=True)
            for r, (xr, sr, outr) in zip(sizes.tolist(), parts, strict=True):
                _separable_blur(xr, _gaussian_taps(sr, r), out=outr)
            return out

        idx = params.blur.nonzero().squeeze(1)
        idx = idx[blur_radius(params.sigma[idx], *x.shape[-2:]).sort(stable=True).indices]
        if idx.numel():
            self._rows_(x, params, idx, blur)


class Mask(Pick):
    """``fn`` runs on the whole batch, ``torch.where`` on the device mask keeps the other rows:
    no host read, the same ops whatever the draw (CUDA graph, compile)."""

    def params(self, params: ColorParams, device: torch.device) -> ColorParams:
        return params.to(device)

    def jitter_terms(self, coef: torch.Tensor) -> list[list[bool]]:
        return [[True] * 4] * 3  # every term, whatever the draw

    def select_(self, x: torch.Tensor, params: ColorParams, mask: torch.Tensor, fn: _Fn) -> None:
        torch.where(mask.view(-1, 1, 1, 1), fn(x, params), x, out=x)  # elementwise: in place

    def blur_(self, x: torch.Tensor, params: ColorParams, max_radius: int, grouped: bool) -> None:
        h, w = x.shape[-2:]
        r = min(max_radius, h - 1, w - 1)  # the largest kernel the op draws, at this view size
        blur = _separable_blur if grouped else _separable_blur_conv
        taps = lambda p: _gaussian_taps(p.sigma.double(), r, blur_radius(p.sigma, h, w))
        self.select_(x, params, params.blur, lambda xs, p: blur(xs, taps(p)))


PICKS: dict[str, Pick] = {"subset": Subset(), "mask": Mask()}


def _as_pick(pick: str | Pick) -> Pick:
    if not isinstance(pick, Pick) and pick not in PICKS:
        raise ValueError(f"pick must be one of {tuple(PICKS)}, got {pick!r}")
    return PICKS.get(pick, pick)


def apply_color_params(
    x: torch.Tensor,
    params: ColorParams,
    spec: ColorSpec,
    group_blur_by_size: bool | None = None,
    *,
    pick: str | Pick = "subset",
) -> torch.Tensor:
    """Run every op of ``spec`` whose parameters ``params`` holds on float images (n, 3, h, w)
    in [0, 1], in place; returns x. ``pick`` is a :class:`Pick` or its name in :data:`PICKS`;
    ``group_blur_by_size`` (default: on the CPU) is the blur's form (:meth:`Blur.apply`).
    """
    pick = _as_pick(pick)
    if group_blur_by_size is None:
        group_blur_by_size = x.device.type == "cpu"
    if len(params) != x.shape[0]:
        raise ValueError(f"{len(params)} parameter sets for {x.shape[0]} images")
    params = pick.params(params, x.device)
    for op in spec.ops:
        if all(name in params.tensors for name in op.names):
            op.apply(x, params, pick, group_blur_by_size)
    return x


class BatchColorAugment:
    """Colour augmentation and normalisation of batches of uint8 views, on their device.

    ``one_pass`` (default: on every device but the CPU) runs the views of one resolution as one
    batch (fewer launches); otherwise each view runs in chunks of about ``cpu_chunk_pixels``
    pixels that stay in cache (2x faster on one core). Neither changes the draws or the result.
    ``pick`` is :func:`apply_color_params`'s (``"mask"`` with ``one_pass`` on GPUs).
    """

    def __init__(
        self,
        color: ColorSpec,
        mean: Sequence[float] = IMAGENET_MEAN_RGB,
        std: Sequence[float] = IMAGENET_STD_RGB,
        *,
        cpu_chunk_pixels: int = 2**19,
        one_pass: bool | None = None,
        pick: str | Pick = "subset",
    ) -> None:
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean/std must be 3 values with std > 0, got {mean}, {std}")
        self.pick = _as_pick(pick)
        self.color = color
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.cpu_chunk_pixels = cpu_chunk_pixels
        self.one_pass = one_pass

    def __call__(
        self,
        views: list[torch.Tensor],
        generator: torch.Generator | None,
        apply_color: bool = True,
        params: Sequence[ColorParams] | None = None,
    ) -> list[torch.Tensor]:
        """uint8 (B, 3, h, w) views -> float32 normalised views on the same device.

        ``generator`` (CPU, or None for the global RNG) drives the draws; ``params`` (one
        ``ColorParams`` per view, drawn in the data workers) replaces them, which makes the result
        independent of how the batch is split across processes.
        """
        given = params is not None and apply_color
        if given and (
            len(params) != len(views)
            or any(len(p) != v.shape[0] for p, v in zip(params, views, strict=True))
        ):
            raise ValueError("params must hold one ColorParams per view, of the view's length")
        groups: dict[tuple, list[int]] = {}
        for i, v in enumerate(views):
            if v.dtype != torch.uint8 or v.dim() != 4 or v.shape[1] != 3:
                raise ValueError(f"expected uint8 (B, 3, h, w) views, got {v.dtype} {v.shape}")
            groups.setdefault((tuple(v.shape[2:]), v.device), []).append(i)
        out: list[torch.Tensor] = [torch.empty(0)] * len(views)
        for members in groups.values():
            sizes = [views[i].shape[0] for i in members]
            group_params = None
            if given:
                group_params = ColorParams.cat([params[i] for i in members])
            elif apply_color:
                group_params = sample_color_params(sum(sizes), self.color, generator)
            if group_params is not None:  # one copy per group (mask pick)
                group_params = self.pick.params(group_params, views[members[0]].device)
            if self._one_pass(views[members[0]].device):
                # Views of one size run as one batch: fewer, larger kernel launches.
                x = self._augment(torch.cat([views[i] for i in members]), group_params)
                for i, xi in zip(members, x.split(sizes), strict=True):
                    out[i] = xi
                continue
            # Chunks keep each view in cache anyway; a concatenation would only add a pass.
            start = 0
            for i, size in zip(members, sizes, strict=True):
                sub = group_params[start : start + size] if group_params is not None else None
                out[i] = self._augment(views[i], sub)
                start += size
        return out

    def _one_pass(self, device: torch.device) -> bool:
        return device.type != "cpu" if self.one_pass is None else self.one_pass

    def _augment(self, v: torch.Tensor, params: ColorParams | None) -> torch.Tensor:
        """uint8 (n, 3, h, w) -> float32 (n, 3, h, w), chunk by chunk unless ``one_pass``."""
        n, _, h, w = v.shape
        one_pass = self._one_pass(v.device)
        x = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        step = n if one_pass else max(1, self.cpu_chunk_pixels // (h * w))
        for start in range(0, n, step):
            xc = x[start : start + step]  # a view: every op below works in place
            xc.copy_(v[start : start + step]).div_(255.0)  # as torchvision's ToTensor
            if params is not None:
                sub = params[start : start + step]
                apply_color_params(xc, sub, self.color, not one_pass, pick=self.pick)
            self.normalize_(xc)
        return x

    def normalize_(self, x: torch.Tensor) -> torch.Tensor:
        """In place ``(x - mean) / std`` per channel, as torchvision's ``Normalize``."""
        return normalize_(x, self.mean, self.std)
