"""``tools/train_pretrain.py`` as a user meets it: its ``-h`` offers only what it does, and a
diverging learning rate ends in one ``error:`` line, exit 2, naming the real last checkpoint or
saying that none was written. The tool's ``main`` runs in this process
(:func:`tests.helpers.mistakes.run_main`: its exit status and output as a process gives them;
tests/test_user_mistakes.py starts it in a real process)."""

from __future__ import annotations

import re

import pytest
import torch

from pretrain.config import load_config
from pretrain.engine.trainer import NonFiniteLossError, PretrainTrainer
from pretrain.utils.errors import LoracError
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


def test_a_non_finite_loss_names_the_real_last_checkpoint(tmp_path):
    data = make_image_folder(tmp_path / "data")
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, tiny_opts(data, tmp_path / "run")))
    trainer.checkpointer.save("model_0000002")
    trainer._first_bad = torch.tensor(4)  # what run_step records when iteration 4's loss is NaN
    with pytest.raises(NonFiniteLossError) as e:
        trainer._raise_if_not_finite()
    assert isinstance(e.value, LoracError) and isinstance(e.value, FloatingPointError)
    last = tmp_path / "run" / "model_0000002.pth"
    assert str(e.value).startswith("non-finite loss at iteration 4; ")
    assert f"the last checkpoint, {last}, is intact" in str(e.value)
    # a lower lr need not start afresh: the message says how to resume with one
    assert "the same command resumes from it (with --resume-with-changes SOLVER.BASE_LR" in str(
        e.value
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_more_cpu_processes_than_cores_is_one_warning_line(device, capsys, monkeypatch):
    from pretrain.cli import train_pretrain

    monkeypatch.setattr(train_pretrain.os, "sched_getaffinity", lambda pid: {0, 1})
    cfg = load_config(DEMO_CONFIG, ["MODEL.DEVICE", device])
    train_pretrain._warn_cpu_processes(cfg, 2)  # as many processes as cores: no word
    assert capsys.readouterr().err == ""
    train_pretrain._warn_cpu_processes(cfg, 3)
    err = capsys.readouterr().err
    if device == "cuda":  # one process per GPU: the cores are no limit
        assert err == ""
    else:
        assert err.startswith("warning: --num-gpus 3 starts 3 CPU processes on 2 cores")
        assert err.count("\n") == 1
