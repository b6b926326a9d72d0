"""The step's policy: the one place where SOLVER.STATIC_STEP and SOLVER.COMPILE are read."""

from __future__ import annotations

import subprocess

from pretrain.config import load_config
from pretrain.config.step_policy import StepPolicy
from tests.helpers import ROOT

CONFIG = str(ROOT / "configs" / "pretrain" / "in1k_r50_lorac_200ep.yaml")


def _policy(*opts: str) -> StepPolicy:
    return StepPolicy.from_config(load_config(CONFIG, list(opts)))


def test_the_default_step_is_eager():
    p = _policy()
    assert (p.graph_safe, p.pick, p.nuclear_norm, p.stats_every_step, p.device_lr) == (
        False, "subset", "eigh", False, False)  # fmt: skip
    assert p.ddp == {} and p.compile is None
    assert p.describe() == "eager step"


def test_the_static_step_is_graph_safe_and_says_so():
    p = _policy("SOLVER.STATIC_STEP", "True")
    assert p.graph_safe and p.pick == "mask" and p.stats_every_step and p.device_lr
    assert p.nuclear_norm == "auto"  # the norm's own choice: Jacobi on a GPU
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
