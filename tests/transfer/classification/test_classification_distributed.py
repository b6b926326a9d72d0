"""The linear probe under torch.distributed: two CPU processes (gloo) via detectron2's launch."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from tests.helpers.classification import QUICK, REPO, make_imagenet


@pytest.mark.processes  # make test-processes
def test_linear_probe_two_processes(tmp_path):
    """Proves the tool runs with --num-gpus 2 on CPU: DDP on the linear layer, a sharded
    sampler (batch 4 = 2 per process), evaluation counts summed over both processes, and only
    the main process writing the table."""
    data = make_imagenet(str(tmp_path / "imagenet"))
    out = str(tmp_path / "run")
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "linear_probe.py"),
        "--num-gpus",
        "2",
        "--dist-url",
        "auto",
        "--config-file",
        os.path.join(QUICK, "linear_instant.yaml"),
        "--random-init",
        "resnet18",
        "--data-root",
        data,
        "--output-dir",
        out,
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "log.txt")) as f:
        log = f.read()
    assert "Rank of current process: 0. World size: 2" in log
    assert "linear probe eval: 6 images" in log  # 3 + 3 from the two shards
    with open(os.path.join(out, "table1_linear.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["Top-5"]) == pytest.approx(100.0)  # 3 classes: every label is in the top 5
    assert os.path.isfile(os.path.join(out, "model_final.pth"))
