"""A resume with a lower learning rate (after a divergence) or a longer schedule (a
finished run extended) works with ``--resume-with-changes`` only, follows the new config's
schedule from the resume iteration on, and is recorded in the run (pretrain/engine/
config_changes.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from detectron2.engine import HookBase

from pretrain.config.defaults import ConfigError, load_config
from pretrain.engine.hooks import BetaSchedule
from pretrain.engine.run import run_pretraining
from pretrain.engine.trainer import PretrainTrainer
from pretrain.solver.build import lr_multiplier
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG


class _Crash(HookBase):
    def __init__(self, at: int) -> None:
        self.at = at

    def before_step(self) -> None:
        if self.trainer.iter == self.at:
            raise RuntimeError("simulated crash")


def _run(opts: list[str], crash_at: int | None = None, with_changes: bool = False):
    hooks = [] if crash_at is None else [_Crash(crash_at)]
    return run_pretraining(load_config(DEMO_CONFIG, opts), hooks, resume_with_changes=with_changes)


def _crashed(opts: list[str], at: int, with_changes: bool = False) -> None:
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(opts, at, with_changes)


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]


def _logged_lr(out: Path, iteration: int) -> float:
    return [m["lr"] for m in _metrics(out) if m["iteration"] == iteration and "lr" in m][-1]


def _scheduled_lr(opts: list[str], iteration: int, max_iter: int) -> float:
    """The learning rate a run started with ``opts`` has at ``iteration`` (3 iterations an
    epoch: 24 images, 8 a batch)."""
    cfg = load_config(DEMO_CONFIG, opts)
    return cfg.SOLVER.BASE_LR * lr_multiplier(cfg, max_iter, 3)(iteration / max_iter)


def _params(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_a_lower_lr_after_a_divergence_resumes_exactly_and_is_recorded(tmp_path, image_folder):
    """The run stopped after the checkpoint of iteration 1 (a divergence at 2, say); resumed at
    half the learning rate it follows the new config's schedule from iteration 2 on; a later
    plain resume of the changed run is exact (same weights as without the interruption)."""
    out = tmp_path / "run"
    every2 = {"SOLVER.CHECKPOINT_PERIOD": 2}  # checkpoints at 1, 3, 5
    opts = tiny_opts(image_folder, out, **every2)
    _crashed(opts, 2)
    old_config = (out / "config.yaml").read_bytes()
    base = load_config(DEMO_CONFIG, opts).SOLVER.BASE_LR
    lower = tiny_opts(image_folder, out, **every2, **{"SOLVER.BASE_LR": base / 2})
    with pytest.raises(ConfigError, match="pass --resume-with-changes"):
        _run(lower)  # not without the flag
    _crashed(lower, 4, with_changes=True)  # resumed at 2 with the change, stopped after 3

    assert _logged_lr(out, 2) == pytest.approx(_scheduled_lr(lower, 2, 6), rel=1e-12)
    assert _logged_lr(out, 1) == pytest.approx(_scheduled_lr(opts, 1, 6), rel=1e-12)
    assert yaml.safe_load((out / "config.yaml").read_text())["SOLVER"]["BASE_LR"] == base / 2
    assert (out / "config.before_change_1.yaml").read_bytes() == old_config
    [entry] = json.loads((out / "config_changes.json").read_text())
    assert entry["iteration"] == 2 and entry["resumed_from"] == "model_0000001.pth"
    assert entry["changes"] == {"SOLVER.BASE_LR": {"from": base, "to": base / 2}}
    assert entry["lr"]["from"] == pytest.approx(_scheduled_lr(opts, 2, 6), rel=1e-12)
    assert entry["lr"]["to"] == pytest.approx(_scheduled_lr(lower, 2, 6), rel=1e-12)
    assert entry["max_iter"] == {"from": 6, "to": 6}
    assert entry["previous_config"] == "config.before_change_1.yaml"
    [event] = [m for m in _metrics(out) if "config_change" in m]
    assert event["iteration"] == 2 and event["config_change"]["SOLVER.BASE_LR"]["to"] == base / 2

    resumed = _run(lower)  # the changed run resumes from 3 without the flag: nothing to record
    assert resumed.start_iter == 4
    assert len(json.loads((out / "config_changes.json").read_text())) == 1
    other = tmp_path / "other"  # the same change, without the second interruption
    _crashed(tiny_opts(image_folder, other, **every2), 2)
    changed = {**every2, "SOLVER.BASE_LR": base / 2}
    uninterrupted = _run(tiny_opts(image_folder, other, **changed), with_changes=True)
    a, b = _params(resumed), _params(uninterrupted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_finished_run_is_extended_keeping_its_final_model_and_beta_switch(
    tmp_path, image_folder, monkeypatch
):
    registered: dict[int, list] = {}  # the hooks each trainer registers, by id(trainer)
    register = PretrainTrainer.register_hooks

    def recording(self, hooks) -> None:
        hooks = list(hooks)
        registered.setdefault(id(self), []).extend(hooks)
        register(self, hooks)

    monkeypatch.setattr(PretrainTrainer, "register_hooks", recording)
    out = tmp_path / "run"
    beta = {"LOSS.BETA_INF_EPOCHS": 1.0}  # beta = inf for the first 3 iterations
    first = _run(tiny_opts(image_folder, out, **beta))
    final = (out / "model_final.pth").read_bytes()
    longer = tiny_opts(image_folder, out, **beta, **{"SOLVER.MAX_ITER": 9})
    with pytest.raises(
        ConfigError, match=r"SOLVER.MAX_ITER: saved 6, now 9.*--resume-with-changes"
    ):
        _run(longer)
    assert (out / "model_final.pth").read_bytes() == final
    extended = _run(longer, with_changes=True)
    assert (extended.start_iter, extended.max_iter) == (6, 9)
    assert (out / "model_0000005.pth").read_bytes() == final  # the finished run's model, kept
    assert (out / "model_final.pth").read_bytes() != final
    [entry] = json.loads((out / "config_changes.json").read_text())
    assert entry["iteration"] == 6 and entry["resumed_from"] == "model_final.pth"
    assert entry["max_iter"] == {"from": 6, "to": 9}
    assert entry["previous_final"] == "model_0000005.pth"
    # the cosine re-stretched over 9 iterations: at 6 the lr rises from FINAL_LR to 9's value
    assert entry["lr"]["from"] == pytest.approx(_scheduled_lr(longer, 6, 6))
    assert _logged_lr(out, 6) == pytest.approx(_scheduled_lr(longer, 6, 9), rel=1e-12)
    assert _logged_lr(out, 6) > entry["lr"]["from"]

    def switch(trainer) -> int:
        [hook] = [h for h in registered[id(trainer)] if isinstance(h, BetaSchedule)]
        return next(i for i in range(9) if math.isfinite(hook.scheduler(i / hook.max_iter)))

    assert switch(first) == switch(extended) == 3


def test_a_schedule_ending_before_the_resume_is_refused_and_nothing_is_written(
    tmp_path, image_folder
):
    out = tmp_path / "run"
    _run(tiny_opts(image_folder, out))
    before = {
        p.name: p.read_bytes() for p in out.iterdir() if p.name.startswith(("config", "model"))
    }
    shorter = tiny_opts(image_folder, out, **{"SOLVER.MAX_ITER": 4})
    with pytest.raises(ConfigError, match="has 4 iterations, and .* resumes at iteration 6"):
        _run(shorter, with_changes=True)
    after = {
        p.name: p.read_bytes() for p in out.iterdir() if p.name.startswith(("config", "model"))
    }
    assert after == before
