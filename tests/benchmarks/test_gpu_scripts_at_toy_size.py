"""The scripts ``make gpu-quick`` and ``make gpu-check`` run on a GPU, run here as a user runs
them, at toy sizes on the CPU: none can rot unseen between GPU windows (a benchmark that crashes
on its first step costs a GPU window)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.helpers import ROOT as REPO
from tests.helpers.mistakes import run_tool

# the caller's path first (make test-oldest-torch puts the oldest torch there); run_tool's
# default is the repository alone
PATH = {"PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)}
SLOW_SAVE = 4.0  # seconds the planted checkpoint writer of the toy run takes, once


def _planted(tmp_path, prelude: str, call: str = "main()") -> str:
    """A script that runs gpu_quick's main (as ``call``) after ``prelude`` (a planted fault)."""
    script = tmp_path / "planted_gpu_quick.py"
    ending = f"\nfrom benchmarks.gpu_quick import main\nraise SystemExit({call})\n"
    script.write_text(textwrap.dedent(prelude) + ending)
    return str(script)


def test_the_quick_gpu_check_runs_every_part_at_toy_size(tmp_path):
    """Every part in the deciding order, no failed part and no failed check; the steady-state
    figures leave out the last iteration, where a (planted, slow) checkpoint writer runs."""
    slow_save = f"""
        import time
        from pretrain.engine.checkpoint import AtomicCheckpointer
        save, slept = AtomicCheckpointer.save, []
        def slow(self, *a, **k):
            if not slept:
                slept.append(time.sleep({SLOW_SAVE}))
            save(self, *a, **k)
        AtomicCheckpointer.save = slow
        """
    r = run_tool([_planted(tmp_path, slow_save), "--device", "cpu", "--tiny", "--out",
                  str(tmp_path)], timeout=900, **PATH)  # fmt: skip
    report = json.loads((tmp_path / "quick.json").read_text())
    parts = report["parts"]
    assert r.returncode == 0 and not report["failures"], (report["failures"], r.stderr[-3000:])
    assert list(parts) == [
        "plain_eager", "lorac_eager", "lorac_compiled", "lorac_cudagraphs",
        "compiled_equals_eager", "plain_compiled", "lorac_static",
        "collectives_world1_all_to_all", "collectives_world1_syncbn", "collectives_world1_ddp",
    ]  # fmt: skip
    assert parts["lorac_compiled"] == {"skipped": parts["lorac_compiled"]["skipped"]}
    assert [k for k, v in parts.items() if "error" in v or "skipped" in v] == ["lorac_compiled"]
    plain = parts["plain_compiled"]  # the compiled plain step (aot_eager at toy size)
    assert plain["compiled"] and plain["step"].endswith("torch.compile")
    eager, graphs = parts["lorac_eager"], parts["lorac_cudagraphs"]
    # 1 warm-up step, 1 timed, 1 profiled, and the last (it logs and writes model_final)
    for row in (eager, graphs, parts["lorac_static"]):
        assert len(row["step_seconds"]) == 4 and row["steps"]["timed"] == 1
        assert row["ms_per_step"] == pytest.approx(1e3 * row["step_seconds"][1])
        assert row["kernels_per_step"] > 0 and row["graph_breaks"] == {}
        assert row["ratio_to_plain_eager"] > 0 and row["ratio_to_plain_compiled"] > 0
        assert row["tflops"] == pytest.approx(
            eager["flops_per_step"] / row["ms_per_step"] * 1e3 / 1e12
        )
    # the planted writer's seconds are the last step's, in no timed one
    assert eager["step_seconds"][-1] >= SLOW_SAVE > eager["ms_per_step_spread"][1] / 1e3
    # the compiled step (the colour ops in one pass, the Jacobi norm): no graph after step 1;
    # no CUDA graph on a CPU (its check is a GPU's)
    assert "LOSS.NUCLEAR_NORM" in graphs["opts"] and "reduce-overhead" in graphs["opts"]
    assert graphs["graphs"] >= 2 and graphs["graphs_after_step_1"] == 0
    assert graphs["graph_launches"] == 0
    same = parts["compiled_equals_eager"]["cudagraphs"]
    assert max(same["loss_relative_differences"]) < 2e-2
    assert same["queue_rows_min_cosine"] > 0.98
    for name in ("all_to_all", "syncbn", "ddp"):
        assert set(parts[f"collectives_world1_{name}"]["differences"].values()) == {0.0}
    # each part printed as it ended: its ms per step and ratios
    assert "lorac_cudagraphs: " in r.stdout and "x plain_eager" in r.stdout


def test_the_gpu_costs_benchmark_runs_at_toy_size(tmp_path):
    out = tmp_path / "costs.json"
    argv = ["--device", "cpu", "--tiny", "--batch", "8", "--rounds", "1", "--iters", "1"]
    r = run_tool(["benchmarks/bench_gpu_costs.py", *argv, "--json", str(out)], timeout=900, **PATH)
    assert r.returncode == 0, r.stderr[-3000:]
    costs = json.loads(out.read_text())
    assert costs["norm_sync"]["median_exact"] > 0 and costs["lars"]["kernels_per_step"] > 0


@pytest.mark.compile  # make test-compile: a compiled toy step of its own (~35 s)
def test_a_planted_recompile_and_a_missing_graph_launch_fail_the_quick_check(tmp_path):
    """The CUDA-graphs step, recompiled at iteration 2 by a changed normalisation mean (the
    colour augmentation's graph read it: a small graph to compile again), and asked for a CUDA
    graph launch a CPU cannot make: exit 1, both written with their causes."""
    plant = """
        import functools
        from detectron2.engine import HookBase
        import benchmarks.gpu_quick as q
        class Shift(HookBase):
            def before_step(self):
                if self.trainer.iter == 2:  # a value the colour augmentation's graph read
                    augment = self.trainer.color_augment
                    augment.mean = tuple(m + 0.01 for m in augment.mean)
        measures = q.Measures(step=functools.partial(q.step_part, hooks=[Shift()]))
        """
    argv = ["--device", "cpu", "--tiny", "--out", str(tmp_path), "--parts", "lorac_cudagraphs",
            "--require-graph-launch"]  # fmt: skip
    r = run_tool([_planted(tmp_path, plant, "main(measures=measures)"), *argv], timeout=900, **PATH)
    report = json.loads((tmp_path / "quick.json").read_text())
    assert r.returncode == 1, r.stderr[-3000:]
    bad = report["failures"]
    assert len(bad) == 2, bad
    assert bad[0].startswith("lorac_cudagraphs: 1 graph(s) added after step 1: iteration 2: ")
    assert "mean" in bad[0], bad
    assert bad[1].startswith("lorac_cudagraphs: no CUDA graph launched in the profiled step")
    assert "FAILED: no CUDA graph launched" in r.stdout
