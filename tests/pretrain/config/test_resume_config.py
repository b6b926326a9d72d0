"""Resuming with a changed config is refused before anything is written: a resume with
MODEL.QUEUE_SIZE 64 instead of 32, say, would replace the queue by a random one and rewrite
config.yaml and the checkpoints."""

from __future__ import annotations

import pytest

from pretrain.config import load_config
from pretrain.config.resume import RESUME_MAY_CHANGE, RESUME_WITH_CHANGES, check_resume_config
from pretrain.engine.trainer import PretrainTrainer
from pretrain.utils.errors import ConfigError
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def _finished_run(image_folder, out):
    PretrainTrainer(load_config(DEMO_CONFIG, tiny_opts(image_folder, out))).train()
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_a_changed_key_is_refused_naming_both_values_and_nothing_changes(tmp_path, image_folder):
    out = tmp_path / "run"
    before = _finished_run(image_folder, out)
    changed = tiny_opts(image_folder, out, **{"MODEL.QUEUE_SIZE": 64, "SOLVER.BASE_LR": 0.5})
    with pytest.raises(ConfigError) as e:
        PretrainTrainer(load_config(DEMO_CONFIG, changed))
    assert "MODEL.QUEUE_SIZE: saved 32, now 64" in str(e.value)
    assert "SOLVER.BASE_LR" in str(e.value) and str(out) in str(e.value)
    after = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}
    assert after == before  # byte-identical: config.yaml, checkpoints, metrics, logs


def test_keys_that_only_watch_the_run_may_change(tmp_path, image_folder):
    out = tmp_path / "run"
    _finished_run(image_folder, out)
    opts = tiny_opts(image_folder, out, **{"SOLVER.LOG_PERIOD": 2, "DATALOADER.NUM_WORKERS": 1})
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    assert trainer.resume()
    assert {"SOLVER.LOG_PERIOD", "DATALOADER.NUM_WORKERS"} <= set(RESUME_MAY_CHANGE)


def test_the_flag_allows_only_the_lr_and_schedule_keys(tmp_path, image_folder):
    """With --resume-with-changes (``with_changes``) a resume may change the learning rate and
    the schedule's length, and nothing else; the check only reads."""
    out = tmp_path / "run"
    before = _finished_run(image_folder, out)
    lr_and_length = {"SOLVER.BASE_LR": 0.5, "SOLVER.FINAL_LR": 0.002, "SOLVER.MAX_ITER": 9}
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **lr_and_length))
    with pytest.raises(ConfigError) as e:
        check_resume_config(cfg)
    assert "SOLVER.MAX_ITER: saved 6, now 9" in str(e.value)
    assert "To resume with the new values pass --resume-with-changes" in str(e.value)
    defaults = load_config(DEMO_CONFIG).SOLVER
    assert check_resume_config(cfg, with_changes=True) == {
        "SOLVER.BASE_LR": (defaults.BASE_LR, 0.5),
        "SOLVER.FINAL_LR": (defaults.FINAL_LR, 0.002),
        "SOLVER.MAX_ITER": (6, 9),
    }
    assert set(RESUME_WITH_CHANGES) == {*lr_and_length, "SOLVER.EPOCHS"}
    queue = {"MODEL.QUEUE_SIZE": 64, "SOLVER.BASE_LR": 0.5}
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **queue))
    with pytest.raises(ConfigError, match="--resume-with-changes allows changes of SOLVER.BASE_LR"):
        check_resume_config(cfg, with_changes=True)
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()} == before
