"""Ctrl-C in the evaluation tools and the demo ends without a traceback and says how to go on:

* a tool with periodic checkpoints (the linear probe) saves one at the next iteration, says in
  one line that the same command with ``--resume`` continues from it, and exits with status 130;
  the resumed run continues after the saved iteration. Real processes, Ctrl-C sent to the whole
  process group as a terminal does (the data worker included);
* the demo's pretraining does what ``tools/train_pretrain.py`` does (a checkpoint, the same
  command resumes);
* a tool stopped with nothing to resume (kNN and the nuclear-norm analysis always; linear
  transfer and the semi-supervised sweep before their first stage or checkpoint, see
  test_classification_resume.py for after) ends with one ``interrupted:`` line saying what its
  output directory holds and how to start again, status 130, no traceback (in this process: the
  interrupt is raised where the work is).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, interrupt_group, make_image_folder, tiny_opts
from tests.helpers.analysis import make_run
from tests.helpers.classification import IMAGENET_CLASSES, QUICK, make_dtd, make_imagenet
from tests.helpers.mistakes import run_main
from transfer.cli import analyze_nuclear_norm, demo, knn_eval, semi_supervised, transfer_linear

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
STOPPED = "stopped after iteration"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    images = make_image_folder(root / "images", classes=2, per_class=4, size=16)
    split = root / "1percent.txt"
    split.write_text("".join(f"{c}_{i}.JPEG\n" for c in IMAGENET_CLASSES for i in range(2)))
    make_dtd(str(root / "transfer" / "dtd"))
    return {
        "imagenet": Path(make_imagenet(str(root / "imagenet"))),
        "images": images,
        "split": split,
        "transfer": root / "transfer",
        "run": make_run(root / "run", images, seed=0),
    }


def _probe(data: dict, out: Path, *extra: str) -> subprocess.Popen:
    argv = ["--config-file", f"{QUICK}/linear_instant.yaml", "--random-init", "resnet18",
            "--data-root", str(data["imagenet"]), "--output-dir", str(out), "SOLVER.MAX_ITER",
            "4000", "SOLVER.CHECKPOINT_PERIOD", "4000", "DATA.NUM_WORKERS", "1",
            *extra]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "linear_probe.py"), *argv],
        cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _wait_for_iteration(out: Path, proc: subprocess.Popen, at_least: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out / "metrics.json"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and json.loads(lines[-1]).get("iteration", -1) >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"no iteration {at_least} (exit {proc.poll()})")


def test_linear_probe_ctrl_c_saves_and_resume_continues(data, tmp_path):
    out = tmp_path / "probe"
    proc = _probe(data, out)
    _wait_for_iteration(out, proc, 3)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    line = [ln for ln in err.splitlines() if ln.startswith(STOPPED)]
    assert len(line) == 1 and line[0].endswith("when the same command is run again with --resume")
    saved = out / (out / "last_checkpoint").read_text().strip()
    assert str(saved) in line[0] and saved.is_file()
    stopped_at = int(saved.stem.removeprefix("model_"))
    assert stopped_at >= 3
    # --resume, after the overrides as users type it, continues after the saved iteration
    proc = _probe(data, out, "--resume")
    _wait_for_iteration(out, proc, stopped_at + 2)
    err = interrupt_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert f"resuming from iteration {stopped_at + 1}" in (out / "log.txt").read_text()


def test_demo_ctrl_c_in_pretraining_saves_a_checkpoint(data, tmp_path, monkeypatch):
    """SIGINT raised in this process after iteration 2 (what a terminal's Ctrl-C delivers)."""
    step = PretrainTrainer.run_step

    def run_step(self):
        step(self)
        if self.iter == 2:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(PretrainTrainer, "run_step", run_step)
    out = tmp_path / "demo"
    opts = tiny_opts(
        data["images"], out, **{"SOLVER.MAX_ITER": 50, "SOLVER.CHECKPOINT_PERIOD": 100}
    )
    r = run_main(
        demo.main, ["--output-dir", str(out), "--knn-train", "4", "--knn-test", "2", *opts]
    )
    assert r.returncode == 130, r.output[-3000:]
    assert "Traceback" not in r.output, r.output[-3000:]
    line = [ln for ln in r.stderr.splitlines() if ln.startswith(STOPPED)]
    assert line == [
        f"stopped after iteration 2 (SIGINT); resumes from {out / 'model_0000002.pth'} when "
        "restarted with the same command"
    ]
    assert (out / "last_checkpoint").read_text() == "model_0000002.pth"


def _knn(data: dict, out: Path) -> list[str]:
    return ["--random-init", "resnet18", "--dataset", "imagefolder", "--data-root",
            str(data["imagenet"]), "--output-dir", str(out), "--num-workers", "0"]  # fmt: skip


def _transfer(data: dict, out: Path) -> list[str]:
    return ["--config-file", f"{QUICK}/transfer_instant.yaml", "--random-init", "resnet18",
            "--data-root", str(data["transfer"]), "--datasets", "dtd", "--output-dir", str(out),
            "--device", "cpu"]  # fmt: skip


def _semi(data: dict, out: Path) -> list[str]:
    return ["--config-file", f"{QUICK}/semi_instant.yaml", "--random-init", "resnet18",
            "--data-root", str(data["imagenet"]), "--split-file", str(data["split"]),
            "--output-dir", str(out), "--device", "cpu"]  # fmt: skip


def _analyze(data: dict, out: Path) -> list[str]:
    return [str(data["run"]), "--dataset", "imagefolder", "--data-root", str(data["imagenet"]),
            "--out", str(out), "--max-images", "2", "--views", "2",
            "--num-workers", "0"]  # fmt: skip


OVERWRITE = "nothing to resume; the same command with --overwrite starts again ({} {} holds"
# tool, its arguments, the function the work is in (where Ctrl-C arrives), what the line says
NOTHING_TO_RESUME = [
    (knn_eval, _knn, "run_knn", OVERWRITE.format("--output-dir", "{out}")),
    (transfer_linear, _transfer, "run_transfer", OVERWRITE.format("--output-dir", "{out}")),
    (semi_supervised, _semi, "run_semi_supervised", OVERWRITE.format("--output-dir", "{out}")),
    (analyze_nuclear_norm, _analyze, "analyze", "nothing was written; the same command starts"),
]


@pytest.mark.parametrize(
    "tool,argv,work,says", NOTHING_TO_RESUME, ids=[t[0].__name__ for t in NOTHING_TO_RESUME]
)
def test_ctrl_c_with_nothing_to_resume_is_one_line(tool, argv, work, says, data, tmp_path,
                                                    monkeypatch):  # fmt: skip
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tool, work, interrupted)
    out = tmp_path / "out"
    r = run_main(tool.main, argv(data, out))
    assert r.returncode == 130, r.output[-3000:]
    assert "Traceback" not in r.output, r.output[-3000:]
    lines = [ln for ln in r.output.splitlines() if ln.startswith("interrupted:")]
    assert len(lines) == 1 and lines[0].startswith("interrupted: stopped at once; "), r.output
    assert says.format(out=out) in lines[0]
