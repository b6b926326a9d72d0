"""The step's policy: the one place where SOLVER.STATIC_STEP and SOLVER.COMPILE are read, built
once by the trainer and passed down to the builders."""

from __future__ import annotations

import subprocess

import pytest

from pretrain.config import load_config
from pretrain.config.step_policy import EAGER_STEP, StepPolicy
from pretrain.data.color import PICKS
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

CONFIG = str(ROOT / "configs" / "pretrain" / "in1k_r50_lorac_200ep.yaml")


def _policy(*opts: str) -> StepPolicy:
    return StepPolicy.from_config(load_config(CONFIG, list(opts)))


def test_the_default_step_is_eager():
    p = _policy()
    assert (p.graph_safe, p.pick, p.auto_nuclear_norm, p.stats_every_step, p.device_lr) == (
        False, "subset", "eigh", False, False)  # fmt: skip
    assert p.ddp == {} and p.compile is None
    assert p.describe() == "eager step"
    assert p == EAGER_STEP  # what a builder called alone builds for
    assert (p.nuclear_norm("auto"), p.nuclear_norm("jacobi")) == ("eigh", "jacobi")


def test_the_static_step_is_graph_safe_and_says_so():
    p = _policy("SOLVER.STATIC_STEP", "True")
    assert p.graph_safe and p.pick == "mask" and p.stats_every_step and p.device_lr
    assert p.nuclear_norm("auto") == "auto"  # the norm's own choice: Jacobi on a GPU
    assert p.nuclear_norm("eigh") == "eigh"  # a method the config names is kept
    assert p.ddp == {"static_graph": True, "gradient_as_bucket_view": True}
    assert p.compile is None and p.describe().startswith("static step:")


def test_compile_implies_the_static_step_with_its_backend_and_mode():
    p = _policy("SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.MODE", "reduce-overhead")
    expected = {"fullgraph": True, "dynamic": False, "backend": "inductor"}
    assert p.graph_safe and p.compile == {**expected, "mode": "reduce-overhead"}
    assert _policy("SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.BACKEND",
                   "aot_eager").compile["mode"] is None  # fmt: skip
    assert p.describe().startswith("compiled step (inductor, mode reduce-overhead)")


def test_no_other_module_reads_the_step_switches():
    """The policy is the one reader of the switches: no second place to keep in step."""
    hits = subprocess.run(
        ["git", "grep", "-n", "-e", "STATIC_STEP", "-e", "COMPILE.ENABLED", "--", "pretrain/*.py"],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    readers = {h.split(":")[0] for h in hits if "cfg." in h or "s.STATIC" in h or "s.COMPILE" in h}
    assert readers <= {"pretrain/config/step_policy.py", "pretrain/config/defaults.py"}, hits


def test_the_policy_is_built_in_one_place_the_trainer():
    """Every builder receives the trainer's policy: no second place decides the step."""
    hits = subprocess.run(
        ["git", "grep", "-n", "-e", "StepPolicy.from_config", "-e", "StepPolicy(", "--",
         "pretrain", "transfer", "tools", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    files = sorted(h.split(":")[0] for h in hits)
    # the trainer's call, and the eager default every builder falls back to when called alone
    assert files == ["pretrain/config/step_policy.py", "pretrain/engine/trainer.py"], hits


@pytest.mark.parametrize(
    ("static", "norm", "pick"), [(False, "eigh", "subset"), (True, "auto", "mask")]
)
def test_the_trainers_policy_reaches_its_model_optimizer_and_augmentation(
    tmp_path, image_folder, static, norm, pick
):
    opts = tiny_opts(image_folder, tmp_path / "run", **{"SOLVER.STATIC_STEP": static})
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    assert trainer.policy.graph_safe == static
    assert trainer.model.criterion.nuclear_norm_method == norm  # LOSS.NUCLEAR_NORM "auto"
    assert trainer.optimizer.device_lr == static
    assert trainer.color_augment.pick is PICKS[pick]
