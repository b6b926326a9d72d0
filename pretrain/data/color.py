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
CPU, so a CUDA batch never waits on a device-to-host synchronisation. Each op is one computation
and picks its samples through a :class:`Pick` named when the augmentation is built (:data:`PICKS`):
host subsets (``"subset"``, the default) or device masks with ``torch.where`` (``"mask"``, for a
CUDA graph or ``torch.compile``), with the same draws and result up to float rounding.
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

    def __getitem__(self, index: slice | torch.Tensor) -> ColorParams:
        """The parameters of a range of samples, or of the samples an index tensor lists."""
        n = len(range(self.n)[index]) if isinstance(index, slice) else len(index)
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
    * :meth:`apply`: changes float images (n, 3, h, w) in [0, 1] in place, from the parameters
      alone (maybe drawn in a data worker), picking its samples with ``pick`` (:class:`Pick`):
      with :class:`Mask` nothing it does (op, shape, host read) may depend on their values.
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
    """A Gaussian blur with probability ``prob`` and sigma uniform in ``sigma`` (MoCo-v2's
    probability; see the module docstring for the kernel)."""

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
        """Each sample's own kernel size (:func:`blur_radius`, zero-padded to the size
        :meth:`Pick.blur_` runs: the same Gaussian), by shifted sums with ``group_by_size`` (the
        CPU's cost is the taps), otherwise by depthwise convolutions (a GPU's: the launches)."""
        pick.blur_(x, params, self.max_radius, group_by_size)


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
    their CPU kernels are several times slower than plain arithmetic. The result is a (n, 3, h, w)
    view of contiguous (3, n, h, w) planes (``torch.compile`` cannot write a non-contiguous
    ``out=``).
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


class Pick:
    """How the colour ops pick the samples they change (:data:`PICKS`), so that no op branches
    on it: ``params`` where the ops read them, ``jitter_terms`` (3 x 4 bools: the blend terms
    each slot runs), ``select_`` (in place ``x[i] <- fn(x, params)[i]`` for the samples the bool
    ``mask`` (n,) picks, the others bit for bit) and ``blur_`` (:meth:`Blur.apply`)."""


class Subset(Pick):
    """``fn`` runs on the picked rows only, which go back by index; masks and parameters are CPU
    tensors, read on the host (no device sync). The least work; shapes vary with the draw."""

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
    """``fn`` runs on the whole batch, ``torch.where`` on the device mask keeping the other rows
    whatever computed them: no host read, the same ops whatever the draw (CUDA graph, compile)."""

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
    """Run every op of ``spec`` (the spec that drew ``params``) whose parameters ``params``
    holds, in the registry's order, on float images (n, 3, h, w) in [0, 1], in place; returns x.

    ``pick`` (a name in :data:`PICKS`, or a :class:`Pick`) runs each op on its samples picked on
    the host (``"subset"``) or on the whole batch with ``params`` on x's device (``"mask"``: no
    op, shape or host read depends on the draw). Same result up to float rounding (about 1e-6).
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

    Call it on the list of view batches a ``MultiCropTransform`` loader yields (after moving them
    to the device). Every sample of every view gets its own parameters; there is no Python loop
    over samples (the loops run over resolutions, jitter slots and tap offsets).

    ``one_pass`` (default: on every device but the CPU) runs the views of one resolution as one
    batch through one pipeline, so a step launches one pipeline per resolution (2 at 3x224 +
    5x96), not one per view. Without it (the CPU default) each view is processed in chunks of
    about ``cpu_chunk_pixels`` pixels, so that the dozens of passes of each chunk stay in cache
    (2x faster than whole-batch passes on one core). Neither changes the random parameters or
    the result.

    ``pick`` is :func:`apply_color_params`'s: ``"mask"`` (meant for GPUs, with ``one_pass``) lets
    a CUDA graph replay the augmentation or ``torch.compile`` take it in one graph.
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
