"""The one strict config loader (pretrain/config/strict.py) and the three loaders built on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fvcore.common.config import CfgNode

import pretrain.config
import transfer.classification.config as classification
import transfer.detection.config as detection
from pretrain.config.strict import load_strict
from pretrain.utils.errors import ConfigError
from tests.helpers import ROOT
from transfer.classification.demo import DEMO_CONFIG

REPO = ROOT


def _defaults() -> CfgNode:
    c = CfgNode()
    c.SOLVER = CfgNode({"BASE_LR": 0.1, "STEPS": (1, 2)})
    c.EXTRA = CfgNode(new_allowed=True)
    return c


def _chain(tmp_path: Path, base_body: str, leaf_body: str = "") -> Path:
    (tmp_path / "base.yaml").write_text(base_body)
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text('_BASE_: "base.yaml"\n' + leaf_body)
    return leaf


def test_merges_base_leaf_and_opts_without_touching_the_defaults(tmp_path):
    defaults = _defaults()
    leaf = _chain(tmp_path, "SOLVER:\n  BASE_LR: 0.5\n", "EXTRA:\n  ANY: 3\n")
    cfg = load_strict(defaults, str(leaf), ["SOLVER.STEPS", "(3, 4)"])
    assert (cfg.SOLVER.BASE_LR, cfg.SOLVER.STEPS, cfg.EXTRA.ANY) == (0.5, (3, 4), 3)
    assert defaults.SOLVER.BASE_LR == 0.1 and "ANY" not in defaults.EXTRA
    assert load_strict(defaults) == defaults  # no file, no opts: the defaults


def test_unknown_key_names_the_base_file_key_and_value(tmp_path):
    leaf = _chain(tmp_path, "SOLVER:\n  BASE_LRR: 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_strict(_defaults(), str(leaf))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'base.yaml'}: ") and "SOLVER.BASE_LRR" in msg
    assert "(value 0.5)" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "body, opts, match",
    [
        ("SOLVER:\n  BASE_LR: fast\n", [], r"leaf\.yaml: Type mismatch .*SOLVER\.BASE_LR"),
        ("SOLVER: [1, 2\n", [], r"leaf\.yaml:2:1: invalid YAML: "),
        ("", [], r"leaf\.yaml: expected a YAML mapping"),
        ("{}", ["SOLVER.BASE_LRR", "1"], r"command-line override: .*BASE_LRR \(value '1'\)"),
        ("{}", ["SOLVER.BASE_LR"], "KEY VALUE pairs"),
    ],
)
def test_bad_values_yaml_and_overrides(tmp_path, body, opts, match):
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text(body)
    with pytest.raises(ConfigError, match=match):
        load_strict(_defaults(), str(leaf), opts)
    with pytest.raises(ConfigError, match="absent.yaml: no such config file"):
        load_strict(_defaults(), str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize(
    "load, base, section",
    [
        (pretrain.config.load_config, DEMO_CONFIG, "LOSS"),
        (
            lambda p: classification.load_config(classification.linear_probe_defaults(), p),
            REPO / "configs" / "eval" / "linear_lorac_in1k.yaml",
            "SOLVER",
        ),
        (detection.load_config, REPO / "configs" / "Base-RCNN-FPN-SyncBN.yaml", "SOLVER"),
    ],
    ids=["pretrain", "classification", "detection"],
)
def test_every_loader_raises_the_same_error(tmp_path, load, base, section):
    """Pretraining, classification and detection configs share the loader, so a typo in a
    leaf gives the same ConfigError (file, key, value) whichever tool reads it."""
    leaf = tmp_path / "typo.yaml"
    leaf.write_text(f'_BASE_: "{base}"\n{section}:\n  TYPOO: 7\n')
    with pytest.raises(ConfigError) as e:
        load(str(leaf))
    assert str(e.value).startswith(f"{leaf}: ") and f"{section}.TYPOO (value 7)" in str(e.value)


@pytest.mark.parametrize(
    "load, base, typo, meant",
    [
        (pretrain.config.load_config, DEMO_CONFIG, "SOLVER.BASE_LRR", "SOLVER.BASE_LR"),
        (
            lambda p, opts=(): classification.load_config(
                classification.linear_probe_defaults(), p, opts
            ),
            REPO / "configs" / "eval" / "linear_lorac_in1k.yaml",
            "SOLVER.MAXITER",
            "SOLVER.MAX_ITER",
        ),
        (
            detection.load_config,
            REPO / "configs" / "Base-RCNN-FPN-SyncBN.yaml",
            "MODEL.RESNETS.DEPHT",
            "MODEL.RESNETS.DEPTH",
        ),
    ],
    ids=["pretrain", "classification", "detection"],
)
def test_an_unknown_key_names_the_closest_known_one(tmp_path, load, base, typo, meant):
    """A typo'd key gets a suggestion, in a YAML file and on the command line, for
    every loader (detectron2's own config included): difflib over the full dotted names."""
    section, key = typo.rsplit(".", 1)
    body = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split(".")))
    leaf = tmp_path / "typo.yaml"
    leaf.write_text(f'_BASE_: "{base}"\n{body}{"  " * (section.count(".") + 1)}{key}: 7\n')
    with pytest.raises(ConfigError) as e:
        load(str(leaf))
    assert str(e.value) == f"{leaf}: unknown config key {typo} (value 7); did you mean {meant}?"
    with pytest.raises(ConfigError) as e:
        load(str(base), [typo, "7"])
    assert str(e.value).endswith(f"unknown config key {typo} (value '7'); did you mean {meant}?")


def test_a_misspelt_section_and_no_suggestion_when_nothing_is_close(tmp_path):
    leaf = _chain(tmp_path, "SOLVR:\n  BASE_LR: 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_strict(_defaults(), str(leaf))  # yacs names the whole unknown section
    assert str(e.value).endswith("unknown config key SOLVR (value {'BASE_LR': 0.5}); did you mean "
                                 "SOLVER?")  # fmt: skip
    with pytest.raises(ConfigError) as e:
        load_strict(_defaults(), "", ["LOSS.TYPOO", "7"])
    assert str(e.value) == "command-line override: unknown config key LOSS.TYPOO (value '7')"


@pytest.mark.parametrize(
    "opts, match",
    [
        (["MODEL.KEY_BN_SPLITS", "0"], r"MODEL\.KEY_BN_SPLITS = 0: must be >= 1"),
        (["MODEL.KEY_BN_SPLITS", "9", "SOLVER.IMS_PER_BATCH", "8", "MODEL.QUEUE_SIZE", "64"],
         r"MODEL\.KEY_BN_SPLITS = 9: leaves empty BN groups of the 8 images"),
    ],
)  # fmt: skip
def test_key_bn_groups_that_batchnorm_cannot_take_are_refused(opts, match):
    """Before any data worker draws a ShuffleBN plan with an empty BN group."""
    from pretrain.config import load_config
    from tests.helpers import ROOT

    with pytest.raises(ConfigError, match=match):
        load_config(str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml"), opts)
