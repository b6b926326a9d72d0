"""The classification tools' loader workers fit the cores: ``DATA.NUM_WORKERS`` and
``FEATURES.NUM_WORKERS`` default to -1, resolved on loading the config (one per core of the
process less one, as in pretraining), so on 2 cores no loader starts more workers than cores and
torch's "This DataLoader will create N worker processes" warning is not raised; an explicit
count is kept, and a negative one other than -1 is a user error.

Each tool runs its shipped recipe made tiny by overrides that leave the worker count alone.
"""

from __future__ import annotations

import os
import warnings

import pytest

from tests.helpers.classification import (  # noqa: F401
    QUICK,
    make_dtd,
    make_imagenet,
    single_thread,
)
from tests.helpers.mistakes import assert_user_error, run_main, snapshot
from tests.helpers.quiet import WORKER_WARNING, patch_two_cores, record_loader_workers
from transfer.classification.config import load_config, transfer_defaults
from transfer.cli import linear_probe, semi_supervised, transfer_linear

RECIPES = os.path.dirname(QUICK)
TINY_INPUT = ["INPUT.TRAIN_CROP", "32", "INPUT.TEST_RESIZE", "36", "INPUT.TEST_CROP", "32"]
TINY_SOLVER = ["SOLVER.BATCH_SIZE", "4", "SOLVER.MAX_ITER", "2", "TEST.BATCH_SIZE", "8"]


@pytest.fixture
def loader_workers(monkeypatch) -> list[int]:
    return record_loader_workers(monkeypatch)


def _run(main, argv: list[str]) -> list[str]:
    """``main(argv + --verbose)`` with every warning recorded; returns the worker warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--verbose"]) == 0
    return [str(w.message) for w in caught if WORKER_WARNING in str(w.message)]


def _saved_config(out: str) -> str:
    with open(os.path.join(out, "config.yaml")) as f:
        return f.read()


def test_linear_probe_workers_fit_two_cores(tmp_path, loader_workers):
    data = make_imagenet(str(tmp_path / "imagenet"))
    out = str(tmp_path / "run")
    recipe = os.path.join(RECIPES, "linear_lorac_in1k.yaml")
    argv = ["--config-file", recipe, "--random-init", "resnet18", "--data-root", data,
            "--output-dir", out, "--device", "cpu", *TINY_INPUT, *TINY_SOLVER]  # fmt: skip
    assert _run(linear_probe.main, argv) == []
    assert loader_workers and max(loader_workers) == 1  # 2 cores less one for the process
    assert "NUM_WORKERS: 1\n" in _saved_config(out)


def test_semi_supervised_workers_fit_two_cores(tmp_path, loader_workers):
    data = make_imagenet(str(tmp_path / "imagenet"))
    split = tmp_path / "1percent.txt"
    split.write_text("n01440764_0.JPEG\nn01443537_1.JPEG\nn01484850_2.JPEG\n")
    out = str(tmp_path / "run")
    recipe = os.path.join(RECIPES, "semi_1pct.yaml")
    argv = ["--config-file", recipe, "--random-init", "resnet18", "--data-root", data,
            "--split-file", str(split), "--output-dir", out, "--device", "cpu",
            "DATA.HELDOUT_PER_CLASS", "2", "SOLVER.LRS", "(0.1,)", *TINY_INPUT,
            *TINY_SOLVER]  # fmt: skip
    assert _run(semi_supervised.main, argv) == []
    assert loader_workers and max(loader_workers) == 1
    assert "NUM_WORKERS: 1\n" in _saved_config(out)


@pytest.mark.parametrize("recipe", ["transfer_linear.yaml", "transfer_linear_augmented.yaml"])
def test_transfer_linear_workers_fit_two_cores(tmp_path, loader_workers, recipe):
    make_dtd(str(tmp_path / "data" / "dtd"))
    out = str(tmp_path / "run")
    argv = ["--config-file", os.path.join(RECIPES, recipe), "--random-init", "resnet18",
            "--data-root", str(tmp_path / "data"), "--datasets", "dtd", "--output-dir", out,
            "--device", "cpu", "INPUT.RESIZE", "36", "INPUT.CROP", "32", "FEATURES.BATCH_SIZE",
            "16", "TRANSFER.BATCH_SIZE", "8", "TRANSFER.NUM_LRS", "1",
            "TRANSFER.BUDGET.DTD.ITERS", "2"]  # fmt: skip
    assert _run(transfer_linear.main, argv) == []
    assert loader_workers and max(loader_workers) == 1
    assert "NUM_WORKERS: 1\n" in _saved_config(out)


def test_explicit_workers_are_kept(monkeypatch):
    patch_two_cores(monkeypatch)
    cfg = load_config(transfer_defaults(), opts=["FEATURES.NUM_WORKERS", "6"])
    assert cfg.FEATURES.NUM_WORKERS == 6


def test_workers_below_minus_one_are_one_error_naming_the_key(tmp_path):
    data = make_imagenet(str(tmp_path / "imagenet"))
    out = tmp_path / "run"
    before = snapshot(out, data)
    recipe = os.path.join(RECIPES, "linear_lorac_in1k.yaml")
    argv = ["--config-file", recipe, "--random-init", "resnet18", "--data-root", data,
            "--output-dir", str(out), "--device", "cpu", "DATA.NUM_WORKERS", "-2"]  # fmt: skip
    r = run_main(linear_probe.main, argv)
    assert_user_error(r, before, out, data, match="DATA.NUM_WORKERS = -2: a number >= 0, or -1")
