"""Every shipped evaluation config loads strictly and states the paper's recipe."""

from __future__ import annotations

import glob
import os
import re

import pytest

from tests.helpers import ROOT
from transfer.classification.config import (
    ConfigError,
    linear_probe_defaults,
    load_config,
    semi_supervised_defaults,
    transfer_defaults,
)
from transfer.classification.linear import log_spaced

CONFIGS = os.path.join(ROOT, "configs", "eval")
FILES = sorted(glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True))


def _defaults(path: str):
    name = os.path.basename(path)
    if name.startswith("transfer"):
        return transfer_defaults()
    if name.startswith("semi"):
        return semi_supervised_defaults()
    assert name.startswith("linear"), f"{path}: unknown config family"
    return linear_probe_defaults()


def test_there_are_configs():
    assert len(FILES) >= 11


@pytest.mark.parametrize("path", FILES, ids=[os.path.relpath(f, CONFIGS) for f in FILES])
def test_config_loads(path):
    cfg = load_config(_defaults(path), path)
    assert cfg.is_frozen()


def _load(name: str, defaults):
    return load_config(defaults, os.path.join(CONFIGS, name))


def test_linear_recipes_match_paper():
    moco = _load("linear_mocov2.yaml", linear_probe_defaults()).SOLVER
    assert (moco.BATCH_SIZE, moco.BASE_LR, moco.MOMENTUM, moco.WEIGHT_DECAY) == (256, 30.0, 0.9, 0)
    assert (moco.EPOCHS, moco.SCHEDULE, tuple(moco.STEPS), moco.GAMMA) == (
        100,
        "step",
        (0.6, 0.8),
        0.1,
    )
    in1k = _load("linear_lorac_in1k.yaml", linear_probe_defaults()).SOLVER
    assert (in1k.BASE_LR, in1k.SCHEDULE, in1k.BATCH_SIZE) == (1.2, "cosine", 256)
    in100 = _load("linear_lorac_in100.yaml", linear_probe_defaults()).SOLVER
    assert (in100.BASE_LR, in100.SCHEDULE) == (0.1, "cosine")


def test_transfer_recipe_matches_paper():
    t = _load("transfer_linear.yaml", transfer_defaults()).TRANSFER
    assert log_spaced(*t.LR_RANGE, t.NUM_LRS)[0] == 0.1 and t.NUM_LRS == 7
    assert (t.BATCH_SIZE, t.MOMENTUM, t.WEIGHT_DECAY) == (256, 0.9, 0.0)
    iters = {k.lower(): v.ITERS for k, v in t.BUDGET.items()}
    assert iters.pop("voc2007") == 5000  # the 13th dataset, as the paper's small ones
    assert t.BUDGET.PLACES365.EPOCHS == 100 and iters["places365"] == 0
    assert {k for k, v in iters.items() if v == 30000} == {
        "birdsnap",
        "cars",
        "cifar10",
        "cifar100",
        "food",
        "sun397",
    }
    assert {k for k, v in iters.items() if v == 5000} == {
        "aircraft",
        "caltech101",
        "dtd",
        "flowers",
        "pets",
    }
    assert transfer_defaults().TRANSFER.BUDGET == t.BUDGET  # defaults are the paper's too
    assert t.PROTOCOL == transfer_defaults().TRANSFER.PROTOCOL == "cached_features"
    aug = _load("transfer_linear_augmented.yaml", transfer_defaults()).TRANSFER
    assert aug.PROTOCOL == "augmented"
    assert {k: v for k, v in aug.items() if k != "PROTOCOL"} == {
        k: v for k, v in t.items() if k != "PROTOCOL"
    }  # the augmented variant changes the pre-processing only


def test_semi_recipes_match_paper():
    one = _load("semi_1pct.yaml", semi_supervised_defaults())
    ten = _load("semi_10pct.yaml", semi_supervised_defaults())
    assert (one.SOLVER.EPOCHS, one.SOLVER.HEAD_LR_MULT, one.DATA.LABEL_PERCENT) == (30, 250.0, 1)
    assert (ten.SOLVER.EPOCHS, ten.SOLVER.HEAD_LR_MULT, ten.DATA.LABEL_PERCENT) == (50, 20.0, 10)
    for c in (one, ten):
        s = c.SOLVER
        assert (s.BATCH_SIZE, s.MOMENTUM, s.WEIGHT_DECAY, s.GAMMA) == (256, 0.9, 0.0, 0.2)
        assert tuple(s.STEPS) == (0.6, 0.8) and tuple(s.LR_RANGE) == (0.01, 10.0)
        assert s.NUM_LRS == 7 and not s.LRS


@pytest.mark.parametrize(
    "key, value, what",
    [
        ("SOLVER.BASE_LR", "-1.0", "must be finite and > 0"),
        ("SOLVER.BASE_LR", "0.0", "must be finite and > 0"),
        ("SOLVER.MOMENTUM", "1.0", "in [0, 1)"),
        ("SOLVER.WEIGHT_DECAY", "-0.1", "must be finite and >= 0"),
    ],
)
def test_solver_values_out_of_range_are_one_error_naming_the_key(key, value, what):
    with pytest.raises(ConfigError, match=re.escape(f"{key} = ") + ".*" + re.escape(what)):
        load_config(linear_probe_defaults(), "", [key, value])


def test_the_semi_supervised_sweep_has_no_base_lr_to_check():
    cfg = load_config(semi_supervised_defaults(), "", ["SOLVER.MOMENTUM", "0.5"])
    assert "BASE_LR" not in cfg.SOLVER and cfg.SOLVER.MOMENTUM == 0.5
