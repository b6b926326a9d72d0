"""Batched colour augmentation: jitter, grayscale and Gaussian blur, then normalisation.

The reference pipelines (SwAV, the public LORAC code, MoCo-v2) run torchvision's ``ColorJitter``,
``RandomGrayscale`` and a PIL Gaussian blur on every view, one image at a time, in the data
loader workers. Here the same augmentations run on whole batches of uint8 views, on whatever
device the views live on (the model's GPU in real runs), with one random draw per sample. The
ops are :class:`ColorOp` subclasses in a registry (:data:`COLOR_OPS`, draw and run order):

* :class:`Jitter`, colour jitter with probability ``prob``; when applied, brightness,
  contrast, saturation and hue run in a random order per sample (``ColorJitter`` draws
  ``torch.randperm(4)`` per image) with factors uniform in ``[max(0, 1 - s), 1 + s]`` and a
  hue shift uniform in ``[-h, h]``; every op clamps to ``[0, 1]`` like torchvision;
* :class:`Grayscale` with probability ``prob`` (torchvision's ITU-R 601 weights, 3 channels);
* :class:`Blur`, a Gaussian blur with probability ``prob`` and sigma uniform in ``sigma``.

Each op equals ``torchvision.transforms.v2.functional`` on float images (``adjust_brightness``,
``adjust_contrast``, ``adjust_saturation``, ``adjust_hue``, ``rgb_to_grayscale``,
``gaussian_blur``) up to float rounding; ``tests/pretrain/data/test_transforms.py`` checks this.

Departures from the reference, on purpose:

* The blur is an exact separable Gaussian with reflect padding and a per-sample kernel of
  ``2 * ceil(3 * sigma) + 1`` taps (3 to 13 for sigma in [0.1, 2]), i.e. torchvision's
  ``gaussian_blur`` with that kernel size (``blur_radius``). The reference uses PIL's
  ``GaussianBlur(radius=sigma)``, an iterated box-filter approximation of the same Gaussian;
  truncating at 3 sigma keeps 99.7% of the Gaussian's mass.
* The ops run on float images in [0, 1] and are not re-quantised to uint8 between ops (the
  reference rounds after every PIL op). When ``color_on_device=False`` the worker rounds once at
  the end.

Random parameters are drawn on the CPU from a ``torch.Generator`` (so a seed fixes them whatever
the device) and copied to the device through pinned memory without a host sync
(:func:`pretrain.utils.device.to_device`); decisions that pick subsets of the batch are made on the
CPU, so a CUDA batch never waits on a device-to-host synchronisation. Those subsets make the
shapes vary from batch to batch; the static-shape mode (``static_shapes=True``) runs every op on
the whole batch and picks samples with ``torch.where`` on device masks instead, for a CUDA graph
or ``torch.compile`` (same draws, same result up to float rounding).
"""

from __future__ import annotations

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
    """Per-sample random colour parameters of ``n`` samples (CPU tensors of n rows), by name.

    Each colour op draws its own tensors (:class:`Jitter`: ``jitter`` (n,) bool, ``factors``
    (n, 4) with the brightness, contrast and saturation factors and the hue shift, ``order``
    (n, 4) the op codes ``BRIGHTNESS`` .. ``HUE`` in the order sample i runs them;
    :class:`Grayscale`: ``grayscale``; :class:`Blur`: ``blur``, ``sigma``), read as attributes
    (``params.sigma``). Sliced, concatenated and collated by name, whatever the ops.
    """

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

    def __getitem__(self, index: slice) -> ColorParams:
        """The parameters of a contiguous range of samples."""
        n = len(range(self.n)[index])
        return ColorParams(n, {k: t[index] for k, t in self.tensors.items()})

    def to(self, device: torch.device | str) -> ColorParams:
        """The parameters on ``device``, copied without a host sync
        (:func:`pretrain.utils.device.to_device`); the same tensors when they are there."""
        return ColorParams(self.n, {k: to_device(t, device) for k, t in self.tensors.items()})

    def pin_memory(self) -> ColorParams:
        """The parameters in pinned host memory (needs CUDA). The DataLoader's pin-memory thread
        calls it on the batches it pins, so that the copy to the GPU is asynchronous with no
        pinning left for the training loop's thread."""
        return ColorParams(self.n, {k: t.pin_memory() for k, t in self.tensors.items()})


class ColorOp:
    """One photometric op of a view. The one place to add an op is a subclass: a frozen
    dataclass whose fields are the op's settings, registered with :func:`color_op` (the
    registry's order is the order ops draw and run in), plus its ``INPUT`` keys in
    ``pretrain/config/defaults.py`` (whose ``*_PROB`` keys are checked to be probabilities).

    * ``config``: the ``INPUT`` key of each setting (field name -> key).
    * ``names``: the parameter tensors :meth:`sample` returns; :meth:`apply` runs when present.
    * :meth:`width`: the uniforms it draws per sample from the one draw of
      :func:`sample_color_params` (``columns``). A new op should draw none when it is off, so
      that the runs that do not use it keep their random stream (``tests/golden`` checks it).
    * :meth:`sample`: its named parameters from its (n, width) uniforms.
    * :meth:`apply`: changes float images (n, 3, h, w) in [0, 1] in place, from the
      parameters alone (they may have been drawn in a data worker).
    * :meth:`apply_static`: the same change in static shapes (``static_shapes=True`` of
      :func:`apply_color_params`): the parameters are on x's device, the op runs on the whole
      batch and keeps the samples it does not touch bit for bit (``torch.where`` on a per-sample
      mask), and nothing it does (op, shape, host read) depends on the drawn values.
    """

    config: ClassVar[dict[str, str]] = {}
    names: ClassVar[tuple[str, ...]] = ()
    columns: ClassVar[int] = 0

    def width(self) -> int:
        return self.columns

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def apply(x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        raise NotImplementedError

    def apply_static(self, x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no static-shape form")

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
    """torchvision's ``ColorJitter(*strengths)`` with probability ``prob``: brightness, contrast,
    saturation and hue in a random order per sample. The defaults are the paper's multi-crop
    values (SwAV's colour distortion with strength 1)."""

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

    @staticmethod
    def apply(x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        if not bool(params.jitter.any()):
            return
        coef, is_hue = _jitter_coefficients(params)
        # Which slots need which terms, decided on the CPU: no device sync, no wasted passes.
        has_gray, has_mean = (coef[1] != 0).any(0).tolist(), (coef[2] != 0).any(0).tolist()
        has_scale = (coef[0] != 1).any(0).tolist()
        coef_dev = to_device(coef, x.device, x.dtype)  # one host-to-device copy
        hue = params.factors[:, 3]
        for slot in range(4):
            if has_scale[slot] or has_gray[slot] or has_mean[slot]:
                fx, fg, fm = coef_dev[:, :, slot].view(3, -1, 1, 1, 1)
                _blend_(x, fx, fg if has_gray[slot] else None, fm if has_mean[slot] else None)
            # The hue is by far the costliest op: run it only on the samples that need it.
            _subset_(x, is_hue[:, slot], lambda xs, i: adjust_hue(xs, hue[i]))

    def apply_static(self, x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        coef, is_hue = _jitter_coefficients(params)  # on x's device, like params
        coef = coef.to(x.dtype)
        hue = params.factors[:, 3]
        planes = x.new_empty((3, *x.shape[:1], *x.shape[2:]))  # (3, n, h, w), every slot's
        for slot in range(4):
            # Every term on every sample: a slot a sample does not use is x * 1 + 0, exact.
            fx, fg, fm = coef[:, :, slot].view(3, -1, 1, 1, 1)
            _blend_(x, fx, fg, fm)
            _hue_into(x, hue, planes.unbind(0))
            _select_(x, is_hue[:, slot], planes.transpose(0, 1))


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

    @staticmethod
    def apply(x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        _subset_(x, params.grayscale, lambda xs, i: rgb_to_grayscale(xs).expand_as(xs))

    def apply_static(self, x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        _select_(x, params.grayscale, rgb_to_grayscale(x))


@color_op
@dataclass(frozen=True)
class Blur(ColorOp):
    """A Gaussian blur with probability ``prob`` and sigma uniform in ``sigma`` (MoCo-v2's
    probability; see the module docstring for the kernel)."""

    sigma: tuple[float, float] = (0.1, 2.0)
    prob: float = 0.5
    # ceil(3 sigma) of the largest sigma the draw can give (float32, as blur_radius), before
    # the clamp to the view's size: the static form's one kernel size. Derived from ``sigma``.
    max_radius: int = field(init=False, repr=False, compare=False)
    config = {"sigma": "BLUR_SIGMA", "prob": "BLUR_PROB"}
    names = ("blur", "sigma")
    columns = 2  # whether to blur, sigma

    def __post_init__(self) -> None:
        lo, hi = self.sigma
        if not 0.0 < lo <= hi:
            raise ValueError(f"blur_sigma must satisfy 0 < min <= max, got {self.sigma}")
        _check_prob(self, "prob")
        # Computed here, not at apply time, so that the static form reads no tensor on the host.
        largest = self.sample(torch.full((1, 2), 1.0 - 2.0**-24))["sigma"]  # torch.rand's max
        object.__setattr__(self, "max_radius", int(torch.ceil(3.0 * largest).clamp_min(1)))

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        lo, hi = self.sigma
        return {"blur": u[:, 0] < self.prob, "sigma": lo + (hi - lo) * u[:, 1]}

    @staticmethod
    def apply(x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        _blur_subset_(x, params.blur, params.sigma, group_by_size=group_by_size)

    def apply_static(self, x: torch.Tensor, params: ColorParams, group_by_size: bool) -> None:
        # One kernel size for every sample: the largest the op draws (at this view size), each
        # sample's own taps zero-padded to it (the same Gaussian as its own kernel size).
        h, w = x.shape[-2:]
        radius = min(self.max_radius, min(h, w) - 1)
        sigma = params.sigma
        taps = _gaussian_taps(sigma.double(), radius, blur_radius(sigma, h, w))
        blurred = (_separable_blur if group_by_size else _separable_blur_conv)(x, taps)
        _select_(x, params.blur, blurred)


@dataclass(frozen=True)
class ColorSpec:
    """The photometric augmentations of one view (the flip is geometric:
    ``CropSpec.flip_prob``): one of each registered op, in the registry's order. ``ColorSpec()``
    holds every op's defaults; :meth:`replace` swaps some."""

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
    """Draw the colour parameters of ``n`` samples on the CPU, with ColorJitter's ranges."""
    # One draw of n x (the ops' widths) uniforms, split among the ops in order: the stream
    # consumed per call is fixed, so seeds reproduce.
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
    """In place ``x <- clamp(fx * x + fg * gray(x) + fm * mean(gray(x)), 0, 1)`` per sample.

    Brightness (fx=f), contrast (fx=f, fm=1-f) and saturation (fx=f, fg=1-f) are all of this
    form, so one slot of the jitter handles a batch whose samples run different ops in one pass.
    fx, fg, fm are (n, 1, 1, 1); fg / fm may be None when no sample needs them.
    """
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

    Same result as torchvision's ``adjust_hue`` (RGB -> HSV, h += shift mod 1, HSV -> RGB) up to
    float rounding, in branch-free arithmetic: a hue rotation keeps each pixel's max and min
    channel, so only the hue H (in sextants, [0, 6)) is computed and mapped back with the
    hexcone's piecewise-linear functions. Boolean masks and ``torch.where`` are avoided because
    their CPU kernels are several times slower than plain arithmetic.
    """
    out = torch.empty_like(x)
    _hue_into(x, shift, out.unbind(dim=1))
    return out


def _hue_into(x: torch.Tensor, shift: torch.Tensor | float, planes: Sequence[torch.Tensor]) -> None:
    """:func:`adjust_hue` of x written into the R, G, B ``planes`` (3 x (n, h, w)): slices of
    (n, 3, h, w), or the contiguous ones of a (3, n, h, w) tensor (``torch.compile`` cannot
    write a result into a non-contiguous ``out=``)."""
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


def blur_radius(sigma: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Kernel half-width per sample: ceil(3 sigma), at least 1, below the image side.

    A kernel of 2 * ceil(3 sigma) + 1 taps keeps 99.7% of the Gaussian's mass; it is about
    OpenCV's default size for 8-bit images and the support of PIL's ``GaussianBlur(radius=sigma)``
    used by the reference code. Sizing it per sample makes the small sigmas cheaper. Reflect
    padding needs the half-width below the image side, hence the upper clamp (tiny views only).
    """
    return torch.ceil(3.0 * sigma).clamp(1, min(height, width) - 1).long()


def _gaussian_taps(
    sigma: torch.Tensor, radius: int, cutoff: torch.Tensor | None = None
) -> torch.Tensor:
    """Normalised 1-D Gaussian taps, (n,) float64 sigma -> (n, 2 * radius + 1).

    Taps further than ``cutoff`` (per sample, <= radius) from the centre are 0, which gives a
    smaller kernel the same result inside a larger one.
    """
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
    """:func:`_separable_blur` as two depthwise convolutions (one launch per pass, not one per
    tap): the one-pass (GPU) path. The CPU keeps the shifted sums, several times faster there.
    Same result up to float rounding; float32 even under autocast."""
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
    """Separable Gaussian blur with a per-sample sigma and a (2 * radius + 1)-tap kernel.

    Equals torchvision's ``gaussian_blur(img, kernel_size=2 * radius + 1, sigma=s)`` (reflect
    padding) up to float rounding. x is float (n, 3, h, w) with h, w > radius; the result goes
    to ``out`` when given (it must not overlap x).
    """
    sig = torch.as_tensor(sigma, dtype=torch.float64).expand(x.shape[0])
    return _separable_blur(x, _gaussian_taps(sig, radius), out)


def _blur_subset_(
    x: torch.Tensor, mask: torch.Tensor, sigma: torch.Tensor, group_by_size: bool
) -> None:
    """Blur the samples of x picked by the CPU bool ``mask``, each with its own kernel size.

    With ``group_by_size`` (for the CPU, where the cost is the taps) each kernel size runs as
    its own slice; otherwise (GPUs, where the cost is kernel launches) one pass of depthwise
    convolutions uses the largest size with the smaller kernels zero-padded. Both give the same
    result up to float rounding.
    """
    idx = mask.nonzero().squeeze(1)
    if idx.numel() == 0:
        return
    radii, order = blur_radius(sigma[idx], *x.shape[-2:]).sort(stable=True)
    idx = idx[order]  # grouped by kernel size: each group is a slice, not another gather
    sig = sigma[idx].double()
    idx_dev = to_device(idx, x.device)
    xs = x.index_select(0, idx_dev)
    if not group_by_size:
        r = int(radii[-1])
        x.index_copy_(0, idx_dev, _separable_blur_conv(xs, _gaussian_taps(sig, r, radii)))
        return
    out = torch.empty_like(xs)
    start = 0
    kernel_radii, counts = radii.unique_consecutive(return_counts=True)
    for r, count in zip(kernel_radii.tolist(), counts.tolist(), strict=True):
        group = slice(start, start + count)
        _separable_blur(xs[group], _gaussian_taps(sig[group], r), out=out[group])
        start += count
    x.index_copy_(0, idx_dev, out)


def _subset_(
    x: torch.Tensor,
    mask: torch.Tensor,
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """Replace the samples of x selected by the CPU bool ``mask`` with ``fn(x[mask], idx)``."""
    idx = mask.nonzero().squeeze(1)
    if idx.numel() == 0:
        return
    if idx.numel() == x.shape[0]:
        x.copy_(fn(x, idx))
        return
    idx_dev = to_device(idx, x.device)
    x.index_copy_(0, idx_dev, fn(x.index_select(0, idx_dev), idx))


def _select_(x: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> None:
    """In place ``x[i] <- y[i]`` where the device bool ``mask`` (n,) is set, full-batch: the
    other samples keep their bits, whatever computed y (a conv or matmul under autocast too)."""
    torch.where(mask.view(-1, 1, 1, 1), y, x, out=x)  # elementwise: x may be its own output


def _jitter_coefficients(params: ColorParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Blend coefficients (3, n, 4) = (fx, fg, fm) per sample and slot, and the hue mask (n, 4).

    Samples that run the hue (or no jitter) in a slot get fx = 1, fg = fm = 0 there, which
    leaves them bit-identical (x * 1 + 0, already in [0, 1]).
    """
    f = params.factors
    op = torch.where(params.jitter[:, None], params.order, -1)  # (n, 4); -1: no jitter
    is_b, is_c, is_s = op == BRIGHTNESS, op == CONTRAST, op == SATURATION
    fx = torch.where(is_b, f[:, 0:1], torch.where(is_c, f[:, 1:2], 1.0))
    fx = torch.where(is_s, f[:, 2:3], fx)
    fg = torch.where(is_s, 1.0 - f[:, 2:3], 0.0)
    fm = torch.where(is_c, 1.0 - f[:, 1:2], 0.0)
    return torch.stack([fx, fg, fm]), (op == HUE) & (f[:, 3:4] != 0)


def apply_color_params(
    x: torch.Tensor,
    params: ColorParams,
    group_blur_by_size: bool | None = None,
    *,
    static_shapes: bool = False,
    spec: ColorSpec | None = None,
) -> torch.Tensor:
    """Run every op whose parameters ``params`` holds (jitter, grayscale, blur, ...: the
    registry's order) on float images (n, 3, h, w) in [0, 1], in place; returns x.

    ``group_blur_by_size`` (default: on the CPU) runs each blur kernel size as its own slice
    (the CPU's cost is the taps); otherwise one pass uses the largest size (a GPU's cost is the
    launches). Both give the same result.

    ``static_shapes`` runs each op of ``spec`` (the spec that drew ``params``; its settings fix
    the blur's kernel size) in its static form (:meth:`ColorOp.apply_static`): ``params`` go to
    x's device first (no copy when they are there), every op runs on the whole batch and picks
    its samples with ``torch.where``, the blur uses the largest kernel the spec can draw, and no
    op, shape or host read depends on the drawn values (what a CUDA graph replay or a compiled
    graph needs: one graph, no sync). Same result up to float rounding (about 1e-6), slower on
    the CPU (every op on every sample); ``group_blur_by_size`` then picks the blur's
    shifted sums (on) or its depthwise convolutions (off).
    """
    if group_blur_by_size is None:
        group_blur_by_size = x.device.type == "cpu"
    if len(params) != x.shape[0]:
        raise ValueError(f"{len(params)} parameter sets for {x.shape[0]} images")
    if not static_shapes:
        for kind in COLOR_OPS:
            if all(name in params.tensors for name in kind.names):
                kind.apply(x, params, group_blur_by_size)
        return x
    if spec is None:
        raise ValueError("static_shapes needs the ColorSpec the parameters were drawn from")
    params = params.to(x.device)
    for op in spec.ops:
        if all(name in params.tensors for name in op.names):
            op.apply_static(x, params, group_blur_by_size)
    return x


class BatchColorAugment:
    """Colour augmentation and normalisation of batches of uint8 views, on their device.

    Call it on the list of view batches a ``MultiCropTransform`` loader yields (after moving them
    to the device). Every sample of every view gets its own parameters; there is no Python loop
    over samples (the loops run over resolutions, jitter slots and tap offsets).

    ``one_pass`` (default: on every device but the CPU) runs the views of one resolution as one
    batch through one pipeline, so a step launches one pipeline per resolution (2 at 3x224 +
    5x96), not one per view. Without it (the CPU default) each view is processed in chunks of
    about ``cpu_chunk_pixels`` pixels, so that the dozens of passes of each chunk stay in cache
    (2x faster than whole-batch passes on one core). Neither changes the random parameters or
    the result.

    ``static_shapes`` (default off) runs the ops in their static forms (``static_shapes`` of
    :func:`apply_color_params`): the same op sequence, shapes and strides whatever the draw and
    no host sync, so that a CUDA graph can replay the augmentation or ``torch.compile`` take it
    in one graph. Meant for GPUs (with ``one_pass``); on the CPU it is slower than the default
    (every op runs on every sample and the blur always uses the largest kernel). The random
    draws do not change, the result only by float rounding.
    """

    def __init__(
        self,
        color: ColorSpec,
        mean: Sequence[float] = IMAGENET_MEAN_RGB,
        std: Sequence[float] = IMAGENET_STD_RGB,
        *,
        cpu_chunk_pixels: int = 2**19,
        one_pass: bool | None = None,
        static_shapes: bool = False,
    ) -> None:
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean/std must be 3 values with std > 0, got {mean}, {std}")
        self.color = color
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.cpu_chunk_pixels = cpu_chunk_pixels
        self.one_pass = one_pass
        self.static_shapes = static_shapes

    def __call__(
        self,
        views: list[torch.Tensor],
        generator: torch.Generator | None,
        apply_color: bool = True,
        params: Sequence[ColorParams] | None = None,
    ) -> list[torch.Tensor]:
        """uint8 (B, 3, h, w) views -> float32 normalised views on the same device.

        ``generator`` (a CPU generator, or None for the global RNG) drives every random draw;
        with ``apply_color=False`` the views are only converted and normalised. ``params`` (one
        ``ColorParams`` of length B per view, e.g. drawn per sample in the data workers) replaces
        the draw, which makes the result independent of how the batch is split across processes.
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
            if given:
                group_params = ColorParams.cat([params[i] for i in members])
            elif apply_color:
                group_params = sample_color_params(sum(sizes), self.color, generator)
            else:
                group_params = None
            if group_params is not None and self.static_shapes:
                group_params = group_params.to(views[members[0]].device)  # one copy per group
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
                apply_color_params(
                    xc,
                    params[start : start + step],
                    not one_pass,
                    static_shapes=self.static_shapes,
                    spec=self.color,
                )
            self.normalize_(xc)
        return x

    def normalize_(self, x: torch.Tensor) -> torch.Tensor:
        """In place ``(x - mean) / std`` per channel, as torchvision's ``Normalize``."""
        return normalize_(x, self.mean, self.std)
