"""A colour op is added in one place: a registered :class:`ColorOp` subclass (plus its INPUT
keys). This test adds one (a solarization) as a user would and checks that the config, the draw,
the workers' collation and the device-side pipeline all pick it up, and that it leaves the runs
that do not use it on their random stream."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torchvision.transforms.v2.functional as TF

from pretrain.config.defaults import get_cfg, validate_cfg
from pretrain.data.color import (
    COLOR_OPS,
    BatchColorAugment,
    Blur,
    ColorOp,
    ColorParams,
    ColorSpec,
    Grayscale,
    Jitter,
    Pick,
    apply_color_params,
    color_op,
    sample_color_params,
)
from pretrain.data.loader import build_train_transform
from pretrain.utils.errors import ConfigError


@dataclass(frozen=True)
class Solarize(ColorOp):
    """torchvision's ``RandomSolarize(threshold, prob)``."""

    threshold: float = 0.5
    prob: float = 0.0
    config = {"threshold": "SOLARIZE_THRESHOLD", "prob": "SOLARIZE_PROB"}
    names = ("solarize", "solarize_threshold")
    columns = 1

    def width(self) -> int:
        return self.columns if self.prob > 0 else 0  # off: no draw, the stream is unchanged

    def sample(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "solarize": u[:, 0] < self.prob,
            "solarize_threshold": torch.full((u.shape[0],), self.threshold),
        }

    def apply(self, x: torch.Tensor, params: ColorParams, pick: Pick, group_by_size: bool) -> None:
        def solarize(xs: torch.Tensor, p: ColorParams) -> torch.Tensor:
            t = p.solarize_threshold.to(xs).view(-1, 1, 1, 1)
            return torch.where(xs >= t, 1.0 - xs, xs)

        pick.select_(x, params, params.solarize, solarize)


@pytest.fixture
def solarize():
    color_op(Solarize)
    yield Solarize
    COLOR_OPS.remove(Solarize)


def cfg_with_solarize(prob: float, threshold: float = 0.5):
    cfg = get_cfg()
    cfg.INPUT.SOLARIZE_PROB = prob
    cfg.INPUT.SOLARIZE_THRESHOLD = threshold
    return cfg


def test_the_registry_is_the_draw_and_run_order():
    assert [Jitter, Grayscale, Blur] == COLOR_OPS
    assert [type(op) for op in ColorSpec().ops] == COLOR_OPS
    # one draw of 12 uniforms per sample: jitter 9, grayscale 1, blur 2
    assert sum(op.width() for op in ColorSpec().ops) == 12


def test_a_new_op_is_read_from_its_config_keys_and_checked(solarize):
    _, spec = build_train_transform(cfg_with_solarize(0.3, 0.6))
    assert spec.op(Solarize) == Solarize(threshold=0.6, prob=0.3)
    with pytest.raises(ConfigError, match="INPUT.SOLARIZE_PROB"):
        validate_cfg(cfg_with_solarize(1.5))


def test_a_new_op_that_is_off_keeps_the_stream_of_the_others(solarize):
    without = ColorSpec((Jitter(), Grayscale(), Blur(), Solarize(prob=0.0)))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = sample_color_params(64, without, g1)
    COLOR_OPS.remove(Solarize)
    b = sample_color_params(64, ColorSpec(), g2)
    COLOR_OPS.append(Solarize)
    assert list(a.tensors) == list(b.tensors)  # no solarize parameters: the op does not run
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in b.tensors)
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize("pick", ["subset", "mask"])
def test_a_new_op_runs_on_device_batches_and_in_the_workers(solarize, pick):
    only = ColorSpec((Jitter(prob=0.0), Grayscale(0.0), Blur(prob=0.0), Solarize(0.4, 1.0)))
    x = torch.rand(6, 3, 16, 16)
    params = sample_color_params(6, only, torch.Generator().manual_seed(0))
    assert params.solarize.all()
    ours = apply_color_params(x.clone(), params, only, pick=pick)
    assert torch.equal(ours, TF.solarize(x, 0.4))
    # the per-sample draws of the workers, stacked by name, drive the device-side pipeline
    views = (x * 255).round().to(torch.uint8)
    per_sample = [sample_color_params(1, only) for _ in range(6)]
    augment = BatchColorAugment(only, pick=pick)
    (out,) = augment([views], None, params=[ColorParams.cat(per_sample)])
    ref = BatchColorAugment(only).normalize_(TF.solarize(views.float() / 255, 0.4))
    torch.testing.assert_close(out, ref)
