"""The throughput ratio of ``make gpu-check`` (``benchmarks/bench_throughput.py``), run on the CPU
at toy sizes so that it cannot rot: the real trainer step of every shipped IN-1K config against
the plain torchvision step, with FLOPs counted and figures that agree with each other.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from benchmarks import bench_throughput
from benchmarks.bench_throughput import CONFIGS, main, measure_plain
from pretrain.engine.trainer import PretrainTrainer


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


def test_tiny_ratio_report_on_cpu(tmp_path, monkeypatch, capsys):
    """One process: the plain eager step, then each shipped IN-1K config's real
    ``PretrainTrainer.run_step`` (every iteration, hooks included), with the overrides applied
    to every config, the JSON written and the table printed."""
    steps = []
    real_step = PretrainTrainer.run_step

    def counted(self):
        steps.append(self.cfg.OUTPUT_DIR)
        real_step(self)

    monkeypatch.setattr(PretrainTrainer, "run_step", counted)
    out = tmp_path / "ratio.json"
    main(["--device", "cpu", "--tiny", "--no-compile", "--opts", "MODEL.QUEUE_SIZE", "64",
          "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out

    rows = report["rows"]
    assert [r["step"] for r in rows] == [
        "torchvision resnet18, supervised, eager",
        *[c.split("/")[-1].removesuffix(".yaml") for c in CONFIGS],
    ]
    plain, project = rows[0], rows[1:]
    assert plain["ratio"] == 1.0 and plain["amp"] == "bfloat16" and plain["channels_last"]
    for row in rows:
        _consistent(row, plain["tflops"])
        assert len(row["window_seconds"]) == 2 and row["batch_per_process"] == 8
        assert f"| {row['step']} | 8 |" in printed
    for row in project:
        assert row["queue_size"] == 64 and row["opts"] == ["MODEL.QUEUE_SIZE", "64"]
        assert row["amp"] == "bfloat16" and row["channels_last"]
    # 1 counted + 2 timed iterations and the one that writes the final checkpoint, per config
    assert len(steps) == 4 * len(CONFIGS)
    # forward + backward of both encoders on every view: LORAC's 3 large + 5 small views cost
    # more than MoCo-v2's 2 large ones, and more than the plain step's one image
    lorac, mocov2 = project[0], project[2]
    assert lorac["flops_per_step"] > 2 * mocov2["flops_per_step"] > 0
    assert mocov2["gflop_per_image"] > plain["gflop_per_image"]


def test_a_mistake_ends_in_one_error_line_before_any_measurement(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_throughput, "measure_plain", lambda **kw: pytest.fail("measured"))
    out = tmp_path / "ratio.json"
    with pytest.raises(SystemExit) as e:
        main(["--device", "cpu", "--tiny", "--opts", "SOLVER.BASE_LRR", "1", "--json", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error:"), err
    assert "BASE_LRR" in err[0]
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_gpu_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--device", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error:"), err


def test_compiled_plain_step_runs_on_cpu():
    """The ``torch.compile`` row, with the ``aot_eager`` backend the toy sizes use (inductor's
    code generation took 45-115 s on 2 cores; on a GPU the row is inductor's)."""
    row = measure_plain("cpu", batch=8, arch="resnet18", size=32, compiled=True,
                        warmup=1, windows=1, iters=1, backend="aot_eager")  # fmt: skip
    assert row["compiled"] and row["step"].endswith("torch.compile")
    assert row["flops_per_step"] > 0 and row["images_per_second"] > 0
