"""Ctrl-C on ``tools/train_net.py``: a checkpoint at the next iteration (with detectron2's
checkpointer: model, optimizer, scheduler, iteration), one line saying that the same command with
``--resume`` continues from it, exit status 130, no traceback; and the resumed run starts after
the saved iteration.

A real process with a data worker, Ctrl-C sent to its process group as a terminal does. The tool
runs through a wrapper that only writes each finished iteration to a file: the test's cue to
press Ctrl-C once training is under way (detectron2 writes its metrics every 20 iterations).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers import ROOT, interrupt_group
from tests.transfer.detection.real_layouts import builtin_datasets_under, write_voc
from tests.transfer.detection.test_detection_protocols import TINY
from tests.transfer.detection.test_detection_train import make_coco
from transfer.detection.convert import convert_checkpoint
from transfer.detection.trainer import build_argument_parser, run

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
# tools/train_net.py, writing the iteration it finished to argv[1] after each step
WRAPPER = """
import sys
from pathlib import Path
from transfer.cli.train_net import main
from transfer.detection.trainer import DetectionTrainer
cue, run_step = Path(sys.argv[1]), DetectionTrainer.run_step
def step(self):
    run_step(self)
    cue.write_text(str(self.iter))
DetectionTrainer.run_step = step
raise SystemExit(main(sys.argv[2:]))
"""


def _argv(tmp: Path, out: Path) -> list[str]:
    json_file, image_root = make_coco(tmp / "coco")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), tmp / "r18.pth")
    convert_checkpoint(str(tmp / "r18.pth"), str(tmp / "r18.pkl"))
    return [
        "--config-file", str(ROOT / "configs" / "coco_faster_rcnn_lorac.yaml"),
        "--register-coco", "shapes", json_file, image_root,
        "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", str(tmp / "r18.pkl"), "MODEL.RESNETS.DEPTH", "18",
        "DATASETS.TRAIN", "('shapes',)", "DATASETS.TEST", "('shapes',)",
        "MODEL.ROI_HEADS.NUM_CLASSES", "2", "MODEL.ROI_BOX_HEAD.FC_DIM", "64",  # small checkpoints
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
        "SOLVER.IMS_PER_BATCH", "2", "SOLVER.BASE_LR", "0.001", "SOLVER.MAX_ITER", "2000",
        "MODEL.RPN.BATCH_SIZE_PER_IMAGE", "32", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32",
        "MODEL.RPN.POST_NMS_TOPK_TRAIN", "100", "TEST.PRECISE_BN.ENABLED", "False",
        "DATALOADER.NUM_WORKERS", "1", "OUTPUT_DIR", str(out),
    ]  # fmt: skip


def _start(argv: list[str], cue: Path, env: dict | None = None) -> subprocess.Popen:
    cue.unlink(missing_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(cue), *argv], cwd=ROOT, env={**ENV, **(env or {})},
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _wait_for_iteration(cue: Path, proc: subprocess.Popen, at_least: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        text = cue.read_text() if cue.exists() else ""
        if text and int(text) >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"no iteration {at_least} (exit {proc.poll()})")


def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tmp_path):
    out, cue = tmp_path / "run", tmp_path / "iteration"
    argv = _argv(tmp_path, out)
    proc = _start(argv, cue)
    _wait_for_iteration(cue, proc, 1)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    line = [ln for ln in err.splitlines() if ln.startswith("stopped after iteration")]
    assert len(line) == 1 and line[0].endswith("when the same command is run again with --resume")
    saved = out / (out / "last_checkpoint").read_text().strip()
    assert str(saved) in line[0] and saved.is_file()
    stopped_at = int(saved.stem.removeprefix("model_"))
    assert stopped_at >= 1
    # --resume, after the overrides as users type it, continues after the saved iteration
    proc = _start([*argv, "--resume"], cue)
    _wait_for_iteration(cue, proc, stopped_at + 1)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert f"Starting training from iteration {stopped_at + 1}" in (out / "log.txt").read_text()


@pytest.mark.protocols  # an R50-C4 (the smallest C4 model): several seconds of training
def test_voc_c4_ctrl_c_resume_and_eval_only(tmp_path):
    """The VOC07+12 C4 config as on COCO: Ctrl-C saves a checkpoint (status 130), --resume
    continues after it, and --eval-only --resume evaluates that checkpoint with VOC's evaluator
    into results.json. The data is VOC2007+VOC2012 in its real layout under
    $DETECTRON2_DATASETS, read by detectron2's builtin registration in the tool's process."""
    write_voc(tmp_path / "datasets")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet50().state_dict(), tmp_path / "r50.pth")
    convert_checkpoint(str(tmp_path / "r50.pth"), str(tmp_path / "lorac.pkl"))
    out, cue = tmp_path / "run", tmp_path / "iteration"
    argv = [
        "--config-file", str(ROOT / "configs" / "voc_faster_rcnn_c4_lorac.yaml"),
        *TINY, "SOLVER.MAX_ITER", "2000", "DATALOADER.NUM_WORKERS", "1",
        "MODEL.WEIGHTS", str(tmp_path / "lorac.pkl"), "OUTPUT_DIR", str(out),
    ]  # fmt: skip
    env = {"DETECTRON2_DATASETS": str(tmp_path / "datasets")}
    proc = _start(argv, cue, env)
    _wait_for_iteration(cue, proc, 1)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    saved = out / (out / "last_checkpoint").read_text().strip()
    stopped_at = int(saved.stem.removeprefix("model_"))
    proc = _start([*argv, "--resume"], cue, env)
    _wait_for_iteration(cue, proc, stopped_at + 1)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert f"Starting training from iteration {stopped_at + 1}" in (out / "log.txt").read_text()
    assert not (out / "results.json").exists()

    # --eval-only --resume, in this process (a third tool process would add its start-up)
    with builtin_datasets_under(tmp_path / "datasets"):
        results = run(build_argument_parser().parse_args(["--eval-only", "--resume", *argv]))
    assert math.isfinite(results["voc_2007_test"]["bbox"]["AP50"])
    written = json.loads((out / "results.json").read_text())["results"]
    assert written["voc_2007_test"]["bbox"]["AP50"] == results["voc_2007_test"]["bbox"]["AP50"]
    last = (out / "last_checkpoint").read_text().strip()
    assert f"Loading from {out / last}" in (out / "log.txt").read_text()
