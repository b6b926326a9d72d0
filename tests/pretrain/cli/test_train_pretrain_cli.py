"""``tools/train_pretrain.py`` as a user meets it: its ``-h`` offers only what it does, and a
diverging learning rate ends in one ``error:`` line, exit 2, saying that no checkpoint was written
(the message naming the real last checkpoint: tests/pretrain/engine/test_step_device_work.py).
The tool's ``main`` runs in this process (:func:`tests.helpers.mistakes.run_main`: its exit status
and output as a process gives them; tests/test_user_mistakes.py starts it in a real process)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.mistakes import run_main, tool_main
from transfer.classification.demo import DEMO_CONFIG

TOOL = "tools/train_pretrain.py"


def test_help_offers_only_what_the_tool_does():
    r = run_main(tool_main(TOOL), ["-h"])
    assert r.returncode == 0, r.output
    for absent in ("--eval-only", "MODEL.WEIGHTS", "jit.script"):
        assert absent not in r.output, absent
    # detectron2's --resume: runs always resume (--resume-with-changes is another option)
    assert not re.search(r"--resume(?![-\w])", r.output), r.output
    for present in ("--config-file", "--num-gpus", "--dist-url", "OUTPUT_DIR/last_checkpoint"):
        assert present in r.output, present


def test_eval_only_is_refused_and_nothing_trains(tmp_path):
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    r = run_main(
        tool_main(TOOL), ["--eval-only", "--config-file", DEMO_CONFIG, *tiny_opts(data, out)]
    )
    assert r.returncode == 2 and "unrecognized option --eval-only" in r.stderr, r.output
    assert not out.exists()


def test_a_diverging_lr_is_one_error_line_saying_no_checkpoint_was_written(tmp_path):
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    opts = tiny_opts(data, out, **{"SOLVER.BASE_LR": 1e30})
    r = run_main(tool_main(TOOL), ["--config-file", DEMO_CONFIG, *opts])
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.output
    assert "Traceback" not in r.output, r.output
    assert errors[0].startswith("error: non-finite loss at iteration ")
    assert f"no checkpoint was written in {out}" in errors[0]
    assert "intact" not in errors[0]
    assert not list(out.glob("*.pth")) and not (out / "last_checkpoint").exists()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_more_cpu_processes_than_cores_is_one_warning_line(device, tmp_path, monkeypatch):
    """On 2 cores, ``--num-gpus 3`` of a CPU run says so in one line and still launches its 3
    processes (the launch itself is left out here); 2 processes, or GPUs, say nothing."""
    from pretrain.cli import launching, train_pretrain

    monkeypatch.setattr(train_pretrain.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the "no GPU" check
    launched = []
    monkeypatch.setattr(launching, "launch", lambda fn, procs, *a, **k: launched.append(procs))
    data = make_image_folder(tmp_path / "data")
    sizes = {"SOLVER.IMS_PER_BATCH": 12, "MODEL.QUEUE_SIZE": 48}  # for 2 and 3 processes
    opts = tiny_opts(data, tmp_path / "run", **{"MODEL.DEVICE": device, **sizes})
    for procs in (2, 3):
        r = run_main(tool_main(TOOL), ["--num-gpus", str(procs), "--config-file", DEMO_CONFIG,
                                       *opts])  # fmt: skip
        assert r.returncode == 0 and launched[-1] == procs, r.output
        if device == "cuda" or procs == 2:  # one process per GPU: the cores are no limit
            assert r.stderr == "", r.output
        else:
            assert r.stderr.startswith("warning: --num-gpus 3 starts 3 CPU processes on 2 cores")
            assert r.stderr.count("\n") == 1, r.output
