"""``tools/svm_voc07.py`` end to end on a small VOC2007 folder with a ResNet-18 (protocols), and
its mistakes ending in one ``error:`` line with nothing written (cheap)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torchvision

from tests.helpers.classification import make_voc2007, single_thread  # noqa: F401
from tests.helpers.mistakes import assert_user_error, run_main, snapshot, tool_main

SVM = tool_main("tools/svm_voc07.py")
SMALL = [
    "--device", "cpu", "SVM.IMAGE_SIZE", "32", "SVM.POOL", "gap", "SVM.COSTS", "(0.1, 1.0)",
    "SVM.LOW_SHOT_COSTS", "(1.0,)", "SVM.LOW_SHOT_K", "(1, 2)", "SVM.LOW_SHOT_DRAWS", "2",
    "FEATURES.NUM_WORKERS", "0",
]  # fmt: skip


@pytest.mark.protocols
def test_svm_tool_on_small_voc2007_with_resnet18_ends_with_table_and_references(tmp_path):
    """Proves: features, per-class SVMs, low-shot draws (recorded: exactly k positives per class,
    by image id) and a table whose published supervised and MoCo v2 rows sit beside this model's
    (marked not comparable: ResNet-18, 32 px); a second run with --resume does nothing more."""
    voc = str(tmp_path / "VOC2007")
    ids = make_voc2007(voc)
    torch.manual_seed(0)
    ckpt = str(tmp_path / "resnet18.pth")
    torch.save(torchvision.models.resnet18().state_dict(), ckpt)
    out = str(tmp_path / "out")
    argv = ["--checkpoint", ckpt, "--name", "R18", "--data-root", voc, "--output-dir", out]
    result = run_main(SVM, [*argv, "--low-shot", *SMALL])
    assert result.returncode == 0, result.output
    table = result.stdout[result.stdout.index("# VOC07 linear SVMs") :]
    assert "| R18 |" in table and "no: resnet18, not ResNet-50" in table
    assert "| Supervised IN-1K ResNet-50 (published) | 87.17 | 52.99 | 63.55 |" in table
    assert "| MoCo v2 200ep ResNet-50 (published) | 84.26 | 43.00 |" in table
    with open(os.path.join(out, "results.json")) as f:
        saved = json.load(f)["results"]
    assert 0.0 <= saved["full"]["map"] <= 1.0 and saved["feature_dim"] == 512
    assert set(saved["low_shot"]) == {"1", "2"} and saved["low_shot"]["2"]["draws"] == 2
    with open(os.path.join(out, "low_shot", "k2_draw1.json")) as f:
        draw = json.load(f)
    assert all(len(p) == 2 and set(p) <= set(ids["trainval"]) for p in draw["positives"].values())
    for name in ("voc07_svm.md", "voc07_svm_low_shot.md", "voc07_svm_low_shot.png"):
        assert os.path.isfile(os.path.join(out, name))
    again = run_main(SVM, [*argv, "--low-shot", "--resume", *SMALL])
    assert again.returncode == 0 and "nothing left to do" in again.output

    # An interrupted run (no results.json, one draw missing): --resume redoes only that draw.
    os.remove(os.path.join(out, "results.json"))
    os.remove(os.path.join(out, "low_shot", "k2_draw1.json"))
    kept = os.path.join(out, "low_shot", "k1_draw0.json")
    stamp = os.stat(kept).st_mtime_ns
    resumed = run_main(SVM, [*argv, "--low-shot", "--resume", *SMALL])
    assert resumed.returncode == 0, resumed.output
    assert "finished before" in resumed.output and os.stat(kept).st_mtime_ns == stamp
    with open(os.path.join(out, "low_shot", "k2_draw1.json")) as f:
        assert json.load(f) == draw  # the same seed draws the same images, to the same mAPs
    with open(os.path.join(out, "results.json")) as f:
        assert json.load(f)["results"] == saved


def test_svm_tool_mistakes_end_in_one_error_line(tmp_path):
    """A missing VOC2007 folder and a low-shot k larger than the data allows: exit 2, one
    ``error:`` line naming the fix, nothing written."""
    voc = str(tmp_path / "VOC2007")
    make_voc2007(voc, {"train": 3, "val": 3, "test": 2})
    out = tmp_path / "out"
    base = ["--random-init", "resnet18", "--output-dir", str(out), "--device", "cpu"]
    before = snapshot(out)
    missing = run_main(SVM, [*base, "--data-root", str(tmp_path / "nope")])
    assert_user_error(missing, before, out, match="Annotations")
    too_few = run_main(SVM, [*base, "--data-root", voc, "--low-shot"])
    assert_user_error(too_few, before, out, match="lower SVM.LOW_SHOT_K")
