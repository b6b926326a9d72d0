"""The throughput ratio of ``make gpu-check`` (``benchmarks/bench_throughput.py``), run as a user
runs it, on the CPU at toy sizes so that it cannot rot: the real trainer step of every shipped
IN-1K config against the plain torchvision step, with FLOPs counted and figures that agree with
each other. (Its compiled plain row runs in ``gpu_quick``'s toy run.)
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from tests.helpers.mistakes import assert_user_error, run_tool, snapshot

CONFIGS = ["in1k_r50_lorac_200ep", "in1k_r50_mocov2_200ep"]
SCRIPT = "benchmarks/bench_throughput.py"


def _consistent(row: dict, reference_tflops: float) -> None:
    """Every figure of a row follows from its FLOPs, its batch and its timed windows."""
    for key in ("flops_per_step", "gflop_per_image", "images_per_second", "tflops"):
        assert row[key] > 0, (row["step"], key)
    windows = row["window_seconds"]
    assert all(w > 0 for w in windows)
    seconds = statistics.median(windows) / row["iterations_per_window"]
    assert row["seconds_per_iteration"] == pytest.approx(seconds, rel=1e-12)
    batch = row["batch_per_process"]
    assert row["images_per_second"] == pytest.approx(batch / seconds, rel=1e-12)
    assert row["gflop_per_image"] * batch * 1e9 == pytest.approx(row["flops_per_step"], rel=1e-12)
    assert row["tflops"] == pytest.approx(row["flops_per_step"] / seconds / 1e12, rel=1e-12)
    assert row["ratio"] == pytest.approx(row["tflops"] / reference_tflops, rel=1e-12)


def test_tiny_ratio_report_on_cpu(tmp_path):
    """One process: the plain eager step, then the real trainer step (every iteration, hooks
    included) of the IN-1K configs named by --configs, with the overrides applied to every
    config, the JSON written and the table printed. LORAC and MoCo-v2: the step's two paths
    (multi-crop, LARS, the prior; two views, SGD); MoCo-M is LORAC's path with beta = inf."""
    out = tmp_path / "ratio.json"
    r = run_tool([SCRIPT, "--device", "cpu", "--tiny", "--no-compile",
                  "--configs", *[f"configs/pretrain/{c}.yaml" for c in CONFIGS],
                  "--opts", "MODEL.QUEUE_SIZE", "64", "--json", str(out)], timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["step"] for r in rows] == ["torchvision resnet18, supervised, eager", *CONFIGS]
    plain, project = rows[0], rows[1:]
    assert plain["ratio"] == 1.0 and plain["amp"] == "bfloat16" and plain["channels_last"]
    for row in rows:
        _consistent(row, plain["tflops"])
        assert len(row["window_seconds"]) == 2 and row["batch_per_process"] == 8
        assert f"| {row['step']} | 8 |" in r.stdout
    for row in project:
        assert row["queue_size"] == 64 and row["opts"] == ["MODEL.QUEUE_SIZE", "64"]
        assert row["amp"] == "bfloat16" and row["channels_last"]
        # 1 counted + 2 timed iterations and the one that writes the final checkpoint
        assert row["steps_run"] == 4
    # forward + backward of both encoders on every view: LORAC's 3 large + 5 small views cost
    # more than MoCo-v2's 2 large ones, and more than the plain step's one image
    lorac, mocov2 = project
    assert lorac["flops_per_step"] > 2 * mocov2["flops_per_step"] > 0
    assert mocov2["gflop_per_image"] > plain["gflop_per_image"]


def test_a_mistake_ends_in_one_error_line_before_any_measurement(tmp_path):
    """A plain batch of -1 would crash the first measurement with a traceback: the one error
    line about the config key shows that the configs are checked before anything runs."""
    before = snapshot(tmp_path)
    argv = ["--device", "cpu", "--tiny", "--plain-batch", "-1", "--opts", "SOLVER.BASE_LRR", "1"]
    r = run_tool([SCRIPT, *argv, "--json", str(tmp_path / "ratio.json")])
    assert_user_error(r, before, tmp_path, match="BASE_LRR")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_gpu_is_one_error_line(tmp_path):
    before = snapshot(tmp_path)
    r = run_tool([SCRIPT, "--device", "cuda", "--json", str(tmp_path / "ratio.json")])
    assert_user_error(r, before, tmp_path, match="no CUDA device")
