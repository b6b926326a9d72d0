"""The run directories of every classification tool that writes one: results.json with its config
and model, ``--resume`` of a finished run has nothing to do and changes nothing, a resumed
checkpoint that does not fit the head is an error (never fvcore's skipped-parameter warning), and
``--overwrite`` starts afresh."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.helpers.classification import make_imagenet
from tests.helpers.mistakes import snapshot
from transfer.cli import linear_probe

QUICK = os.path.join("configs", "eval", "quick_schedules", "linear_instant.yaml")


@pytest.fixture
def probe_argv(tmp_path) -> list[str]:
    data = make_imagenet(str(tmp_path / "imagenet"))
    return ["--config-file", QUICK, "--random-init", "resnet18", "--name", "rand",
            "--data-root", data, "--output-dir", str(tmp_path / "run"),
            "SOLVER.MAX_ITER", "2"]  # fmt: skip


def test_finished_probe_results_and_resume(probe_argv, tmp_path, capsys):
    out = tmp_path / "run"
    linear_probe.main(probe_argv)
    saved = json.loads((out / "results.json").read_text())
    assert saved["model"] == "rand" and saved["config"]["SOLVER"]["MAX_ITER"] == 2
    assert 0 <= saved["results"]["top1"] <= 1
    before = snapshot(out)
    capsys.readouterr()
    linear_probe.main(["--resume", *probe_argv])
    assert "nothing left to do" in capsys.readouterr().out
    assert snapshot(out) == before
    linear_probe.main(["--overwrite", *probe_argv, "SOLVER.BASE_LR", "0.5"])
    assert json.loads((out / "results.json").read_text())["config"]["SOLVER"]["BASE_LR"] == 0.5


def test_a_head_checkpoint_that_does_not_fit_is_an_error(probe_argv, tmp_path, capsys):
    out = tmp_path / "run"
    linear_probe.main(probe_argv)
    (out / "results.json").unlink(missing_ok=True)  # unfinished, its checkpoint swapped by hand
    ckpt = torch.load(out / "model_final.pth", weights_only=True)
    ckpt["model"]["weight"] = torch.zeros(7, 512)
    torch.save(ckpt, out / "model_final.pth")
    with pytest.raises(SystemExit) as e:
        linear_probe.main(["--resume", *probe_argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "weight (7, 512) vs model (3, 512)" in err and "model_final.pth" in err
    assert not (out / "results.json").exists()
