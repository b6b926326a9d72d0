"""tools/train_net.py keeps a finished OUTPUT_DIR as it was: a rerun into it is refused, a rerun
that fails (even with ``--overwrite``) fails before writing, a ``--resume`` of a finished run has
nothing to do, a checkpoint that does not fit is an error, an unconverted pretraining checkpoint is
named as such, results.json carries its config and weights, and a run without a test set ends with
exit 0 saying no evaluation ran."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers.mistakes import assert_user_error, run_main, snapshot, tool_main
from tests.transfer.detection.test_detection_train import instant_args, make_coco
from transfer.detection.results import ResultsError, read_run

QUICK = ["TEST.PRECISE_BN.ENABLED", "False", "SOLVER.MAX_ITER", "2", "SOLVER.STEPS", "(1,)"]


def detection_argv(data, out: Path, *opts: str, flag: str = "", weights: str = "") -> list[str]:
    """The command line of a two-iteration Faster R-CNN run (from random weights by default)
    with the option ``flag`` and the overrides ``opts``."""
    args = instant_args("faster_rcnn", data, weights, out)
    json_file, image_root = data["shapes"]
    argv = ["--config-file", args.config_file, *([flag] if flag else [])]
    return [*argv, "--register-coco", "instant_shapes", json_file, image_root, *args.opts, *QUICK,
            *opts]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return {"shapes": make_coco(tmp_path_factory.mktemp("coco") / "shapes")}


def _train_net(*argv: str):
    """tools/train_net.py's ``main`` in this process, ended as a process ends (the datasets it
    registers are unregistered after it: a name is registered once per process)."""
    return run_main(tool_main("tools/train_net.py"), list(argv))


def train_finished(data, out: Path) -> Path:
    """A finished run directory at ``out``."""
    r = _train_net(*detection_argv(data, out))
    assert r.returncode == 0, r.output[-3000:]
    return out


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory) -> Path:
    """A finished run directory (never changed by the tests: each copies it first if it must)."""
    return train_finished(data, tmp_path_factory.mktemp("finished"))


def test_results_carry_their_config_and_weights(finished):
    saved = json.loads((finished / "results.json").read_text())
    assert saved["weights"] == "" and saved["pretraining"] == "random"
    assert saved["config"]["OUTPUT_DIR"] == str(finished)
    assert saved["config"]["SOLVER"]["MAX_ITER"] == 2
    assert set(saved["results"]["instant_shapes"]) == {"bbox"}


def test_a_rerun_into_a_finished_run_is_refused_and_changes_nothing(data, finished):
    before = snapshot(finished)
    r = _train_net(*detection_argv(data, finished))
    assert_user_error(r, before, finished, match="holds a finished run")
    assert "--overwrite" in r.stderr and "--resume" in r.stderr


def test_a_failed_overwrite_changes_nothing_and_names_the_converter(data, finished, tmp_path):
    """Unconverted torchvision weights with --overwrite: the weights check fails before the old
    run's results.json, config.yaml or model_final.pth is touched."""
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    before = snapshot(finished)
    r = _train_net(
        *detection_argv(data, finished, flag="--overwrite", weights=str(tmp_path / "r18.pth"))
    )
    assert_user_error(r, before, finished, match="convert_to_d2.py")
    assert "MODEL.RESNETS.DEPTH" not in r.stderr
    assert read_run(str(finished)).pretraining == "random"  # still the old run's label


def test_resuming_a_finished_run_has_nothing_to_do(data, finished):
    before = snapshot(finished)
    r = _train_net(*detection_argv(data, finished, flag="--resume"))
    assert r.returncode == 0, r.output[-3000:]
    assert "nothing left to do" in r.output
    assert snapshot(finished) == before


def test_resume_with_another_config_is_refused(data, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "results.json").unlink()  # an unfinished run
    before = snapshot(out)
    r = _train_net(*detection_argv(data, out, "SOLVER.BASE_LR", "0.002", flag="--resume"))
    assert_user_error(r, before, out, match="SOLVER.BASE_LR: saved 0.001, now 0.002")


def test_a_checkpoint_that_does_not_fit_is_an_error_on_resume(data, finished, tmp_path):
    """A checkpoint swapped by hand (one tensor of another shape): an error, not fvcore's
    'Skip loading parameter' warning and a half-random model."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "results.json").unlink()
    ckpt = torch.load(out / "model_final.pth", weights_only=True)
    ckpt["model"]["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(5, 1024)
    torch.save(ckpt, out / "model_final.pth")
    before = snapshot(out)
    r = _train_net(*detection_argv(data, out, flag="--resume"))
    assert_user_error(r, before, out, match="checkpoint")
    assert "cls_score.weight (5, 1024) vs model (3, 1024)" in r.stderr


def test_overwrite_without_a_test_set_ends_well_and_says_so(data, finished, tmp_path):
    """--overwrite replaces the old run (its results.json goes: no table can show its numbers
    with the new run's settings); with DATASETS.TEST empty the run ends with exit 0."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    r = _train_net(*detection_argv(data, out, "DATASETS.TEST", "()", flag="--overwrite"))
    assert r.returncode == 0, r.output[-3000:]
    assert "no evaluation ran" in r.output and "Traceback" not in r.output
    assert (out / "model_final.pth").is_file()
    with pytest.raises(ResultsError, match="no evaluation ran"):
        read_run(str(out))
