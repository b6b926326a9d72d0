"""A YAML syntax error names the file, line and column, and an integer for a float key is that
float, as detectron2/yacs users write ``SOLVER.BASE_LR 1``; the other type mismatches are
errors. Every config of the project loads through
``pretrain.config.strict.load_strict``: pretraining, classification and detection alike."""

from __future__ import annotations

import re

import pytest

import pretrain.config
import pretrain.config.defaults
import transfer.detection.config as detection
from pretrain.utils.errors import ConfigError
from tests.helpers import ROOT
from transfer.classification.demo import DEMO_CONFIG

LOADERS = {
    "pretrain": (pretrain.config.load_config, DEMO_CONFIG),
    "detection": (detection.load_config, ROOT / "configs" / "Base-RCNN-FPN-SyncBN.yaml"),
}


@pytest.mark.parametrize("tool", list(LOADERS))
@pytest.mark.parametrize(
    "body, where",
    [
        # line numbers count the leaf's _BASE_ line (line 1); columns from 1, as editors do.
        # An unclosed list: the parser fails at line 4, column 6, and says where the list began
        ("SOLVER:\n  BASE_LR: [0.1\nMODEL: x\n", r":4:6: invalid YAML: expected ',' or ']'.*"
         r"\(while parsing a flow sequence at line 3, column 12\)"),
        ("SOLVER:\n  BASE_LR: a: b\n", ":3:13: invalid YAML: mapping values are not allowed"),
        ("\tSOLVER: 1\n", r":2:1: invalid YAML: found character '\\t'"),
    ],
)  # fmt: skip
def test_yaml_syntax_error_names_file_line_and_column(tmp_path, tool, body, where):
    load, base = LOADERS[tool]
    leaf = tmp_path / "bad.yaml"
    leaf.write_text(f'_BASE_: "{base}"\n' + body)
    with pytest.raises(ConfigError) as e:
        load(str(leaf))
    msg = str(e.value)
    assert "\n" not in msg and "None" not in msg
    assert re.match(re.escape(str(leaf)) + where, msg), msg


def test_syntax_error_in_a_base_file_names_that_file(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  ARCH: resnet18: x\n')
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text('_BASE_: "base.yaml"\nSOLVER:\n  BASE_LR: 0.1\n')
    with pytest.raises(ConfigError, match=rf"^{base}:3:17: invalid YAML: mapping values"):
        pretrain.config.load_config(str(leaf))


@pytest.mark.parametrize("tool", list(LOADERS))
def test_an_integer_for_a_float_key_is_that_float(tmp_path, tool):
    load, base = LOADERS[tool]
    leaf = tmp_path / "int.yaml"
    leaf.write_text(f'_BASE_: "{base}"\nSOLVER:\n  BASE_LR: 2\n')
    cfg = load(str(leaf))
    assert cfg.SOLVER.BASE_LR == 2.0 and type(cfg.SOLVER.BASE_LR) is float
    cfg = load(str(leaf), ["SOLVER.BASE_LR", "1"])
    assert cfg.SOLVER.BASE_LR == 1.0 and type(cfg.SOLVER.BASE_LR) is float


@pytest.mark.parametrize(
    "opts, match",
    [
        (["SOLVER.MAX_ITER", "3.0"], r"Type mismatch .*SOLVER\.MAX_ITER"),  # never float -> int
        (["SOLVER.BASE_LR", "True"], r"Type mismatch .*SOLVER\.BASE_LR"),  # a bool is no number
        (["SOLVER.AMP.ENABLED", "1"], r"Type mismatch .*SOLVER\.AMP\.ENABLED"),
        (["SOLVER.BASE_LR", "fast"], r"Type mismatch .*SOLVER\.BASE_LR"),
    ],
)
def test_other_type_mismatches_stay_errors(opts, match):
    with pytest.raises(ConfigError, match=match):
        pretrain.config.load_config(DEMO_CONFIG, opts)


@pytest.mark.parametrize("key", [*pretrain.config.defaults.POSITIVE_INTS, "MODEL.ARCH"])
def test_every_size_that_must_be_positive_and_the_arch_are_checked_with_the_config(key):
    """The config's own check (before any run directory exists) names each of these keys: a 0
    head dim trained a constant head, MODEL.ARCH resnet-50 failed in the model after the run's
    config.yaml, env.txt and log.txt were written."""
    value = "resnet-50" if key == "MODEL.ARCH" else "0"
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} = "):
        pretrain.config.load_config(DEMO_CONFIG, [key, value])
