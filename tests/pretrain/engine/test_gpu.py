"""The CUDA path, run by ``make gpu-check`` on a machine with a GPU (skipped without one).

No GPU has been lent to this project yet: these tests have never run. They check what the CPU
tests cannot: that a pretraining run trains on CUDA with the shipped GPU defaults (bfloat16,
channels_last, cudnn.benchmark), that its step makes no host sync outside the logging period
there too, and that the throughput benchmark runs.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_step import measure as count_step
from benchmarks.bench_throughput import measure as throughput
from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CONFIG = str(ROOT / "configs" / "pretrain" / "in100_r18_lorac_beta2.yaml")


def test_gpu_pretraining_run_trains_with_the_gpu_defaults(tmp_path, image_folder):
    opts = tiny_opts(image_folder, tmp_path / "o", **{"MODEL.DEVICE": "cuda"})
    opts += ["SOLVER.AMP.ENABLED", "True", "MODEL.CHANNELS_LAST", "True", "TEST.KNN_PERIOD", "0"]
    opts += ["DATASETS.CLASS_LIST", ""]
    trainer = PretrainTrainer(load_config(CONFIG, opts))
    trainer.train()
    assert next(trainer.model.parameters()).is_cuda
    assert (tmp_path / "o" / "model_final.pth").exists()


def test_gpu_step_has_no_host_sync():
    m = count_step("configs/pretrain/in1k_r50_lorac_200ep.yaml", procs=1, device="cuda")
    assert m["host_syncs"] == 0, m["syncs_by_source"]
    assert m["ops"] <= 3000


def test_gpu_throughput_benchmark_runs():
    result = throughput(batch=8, iters=2, warmup=1)
    assert result["images_per_second"] > 0
