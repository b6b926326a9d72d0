"""Ctrl-C on ``tools/train_pretrain.py``: a checkpoint at the next iteration boundary, one line
saying how to resume, exit status 130; a second Ctrl-C stops at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def _start(data: Path, out: Path) -> subprocess.Popen:
    opts = tiny_opts(data, out, **{"SOLVER.MAX_ITER": 400, "SOLVER.CHECKPOINT_PERIOD": 1000})
    cmd = [sys.executable, str(ROOT / "tools" / "train_pretrain.py"), "--config-file",
           DEMO_CONFIG, *opts]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)


def _wait_for_iteration(out: Path, proc: subprocess.Popen, at_least: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out / "metrics.json"
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            if lines and json.loads(lines[-1]).get("iteration", -1) >= at_least:
                return
        time.sleep(0.2)
    raise AssertionError(f"no iteration {at_least} (exit {proc.poll()})")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("int") / "data")


def test_ctrl_c_saves_a_checkpoint_and_exits_130_then_the_run_resumes(data, tmp_path):
    out = tmp_path / "run"
    proc = _start(data, out)
    _wait_for_iteration(out, proc, 3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    stop_line = [line for line in err.splitlines() if "resumes from" in line]
    assert len(stop_line) == 1 and "(SIGINT)" in stop_line[0], err[-3000:]
    saved = (out / "last_checkpoint").read_text()
    assert saved in stop_line[0] and (out / saved).exists()
    stopped_at = int(saved.removeprefix("model_").removesuffix(".pth"))
    assert stopped_at >= 3
    # the same command resumes after the saved iteration
    proc = _start(data, out)
    _wait_for_iteration(out, proc, stopped_at + 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert f"continuing at iteration {stopped_at + 1}" in (out / "log.txt").read_text()
    assert proc.returncode == 130


def test_a_second_ctrl_c_stops_at_once_with_one_line(data, tmp_path):
    out = tmp_path / "run"
    proc = _start(data, out)
    _wait_for_iteration(out, proc, 2)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert sum("interrupted: stopped at once" in line for line in err.splitlines()) <= 1
