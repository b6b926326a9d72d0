"""CPU bfloat16 autocast is refused where oneDNN's weight gradient is wrong (1 px maps under a
strided conv); :mod:`pretrain.diagnostics.cpu_bfloat16` counts the fault itself
(tests/pretrain/diagnostics/test_cpu_bfloat16.py)."""

from __future__ import annotations

import pytest

from pretrain.config.defaults import ConfigError, load_config
from pretrain.engine.launch import check_cpu_bfloat16
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts

DEMO_CONFIG = str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml")


def _cfg(**opts):
    flat = [str(x) for kv in {"DATASETS.ROOT": "/x", **opts}.items() for x in kv]
    return load_config(DEMO_CONFIG, flat)


def test_the_trainer_refuses_before_writing_anything(tmp_path, image_folder):
    out = tmp_path / "run"
    opts = {"SOLVER.AMP.ENABLED": True, "INPUT.SMALL_CROPS": 2, "INPUT.SMALL_SIZE": 16}
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **opts))
    match = r"INPUT\.SMALL_SIZE = 16 .*layer4\.0\.conv1.*at least 17 px"
    with pytest.raises(ConfigError, match=match):
        PretrainTrainer(cfg)
    assert not out.exists()


@pytest.mark.parametrize(
    "opts",
    [
        {"SOLVER.AMP.ENABLED": True},  # the demo: 24 px views only (SMALL_SIZE 12 is unused)
        {"SOLVER.AMP.ENABLED": True, "INPUT.SMALL_CROPS": 2, "INPUT.SMALL_SIZE": 17},
        {"SOLVER.AMP.ENABLED": False, "INPUT.LARGE_SIZE": 16},
        {"SOLVER.AMP.PRECISION": "float16", "INPUT.LARGE_SIZE": 16},  # exact in float16
        {"MODEL.STEM": "small", "INPUT.LARGE_SIZE": 16},
    ],
)
def test_what_is_allowed(opts):
    check_cpu_bfloat16(_cfg(**opts))


def test_the_large_size_is_named_too():
    with pytest.raises(ConfigError, match=r"INPUT\.LARGE_SIZE = 16 .*resnet18"):
        check_cpu_bfloat16(_cfg(**{"INPUT.LARGE_SIZE": 16}))
