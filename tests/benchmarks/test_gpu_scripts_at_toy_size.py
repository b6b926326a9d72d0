"""The scripts ``make gpu-quick`` and ``make gpu-check`` run on a GPU, run here as a user runs
them, at toy sizes on the CPU: none can rot unseen between GPU windows (a benchmark that crashes
on its first step costs a GPU window)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.mistakes import run_tool


def test_the_quick_gpu_check_runs_every_part_at_toy_size(tmp_path):
    args = ["--device", "cpu", "--tiny", "--out", str(tmp_path)]
    r = run_tool(["benchmarks/gpu_quick.py", *args], timeout=900)
    report = json.loads((tmp_path / "quick.json").read_text())
    errors = {k: v["error"] for k, v in report["parts"].items() if "error" in v}
    assert r.returncode == 0 and not errors, (errors, r.stderr[-3000:])
    parts = report["parts"]
    assert {"plain_eager", "plain_compiled", "lorac_eager", "lorac_static", "lorac_compiled",
            "compiled_equals_eager", "collectives_world1"} <= set(parts)  # fmt: skip
    plain = parts["plain_compiled"]  # the compiled plain step (aot_eager at toy sizes)
    assert plain["compiled"] and plain["step"].endswith("torch.compile")
    assert plain["flops_per_step"] > 0 and plain["images_per_second"] > 0
    compiled = parts["lorac_compiled"]
    assert compiled["recompiles"] == 0, compiled
    assert compiled["graph_breaks"] == {}
    # --tiny: 3 steps and the one that writes the final checkpoint, each timed
    assert len(compiled["step_wall_seconds"]) == 4 and compiled["kernels_per_step"] > 0
    assert parts["lorac_eager"]["flops_per_step"] > 0 and compiled["ratio_to_plain_eager"] > 0
    assert parts["compiled_equals_eager"]["queue_rows_in_order"]
    world1 = parts["collectives_world1"]
    assert world1["all_to_all_channels_last_equal"]
    losses = world1["ddp_compiled_losses"]
    assert losses["ddp_compiled"] == pytest.approx(losses["eager"], rel=1e-5)


def test_the_gpu_costs_benchmark_runs_at_toy_size(tmp_path):
    out = tmp_path / "costs.json"
    r = run_tool(["benchmarks/bench_gpu_costs.py", "--device", "cpu", "--tiny", "--batch", "8",
                  "--rounds", "1", "--iters", "1", "--json", str(out)], timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    costs = json.loads(out.read_text())
    assert costs["norm_sync"]["median_exact"] > 0 and costs["lars"]["kernels_per_step"] > 0
