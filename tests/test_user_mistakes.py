"""Plausible mistakes with the pretraining-side tools, the demo and the weight converters
(issue 34): each ends in exit 2, exactly one ``error:`` line, no traceback, and nothing written
or changed (tests/helpers/mistakes.py), and no ``torch.jit.script`` deprecation noise.

One row per mistake: ``(tool and arguments, text the error line must contain)``. ``{data}`` is a
small image folder, ``{split}`` the same as ``train/`` + ``val/``, ``{ckpt}`` a MoCo-style
checkpoint, ``{tmp}`` the test's directory; everything under ``{tmp}`` must stay as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.checkpoints import pre
from tests.helpers.mistakes import assert_user_error, run_tool, snapshot
from transfer.classification.demo import DEMO_CONFIG

PRETRAIN = ["tools/train_pretrain.py", "--config-file", DEMO_CONFIG]
DEMO = ["tools/demo.py", "--output-dir", "{tmp}/demo"]
IMAGEFOLDER = ["DATASETS.TYPE", "imagefolder", "SOLVER.MAX_ITER", "2"]
D2 = "tools/convert_to_d2.py"
EXPORT = "tools/export_backbone.py"
SUBMIT = ["tools/submit_pretrain.py", "--dry-run", "--config-file", DEMO_CONFIG,
          "MODEL.DEVICE", "cpu", "OUTPUT_DIR", "{tmp}/run"]  # fmt: skip

ROWS = {
    # train_pretrain: config files and overrides
    "pretrain-missing-config": (
        ["tools/train_pretrain.py", "--config-file", "{tmp}/nowhere.yaml"],
        "nowhere.yaml: no such config file",
    ),
    "pretrain-yaml-syntax": (
        ["tools/train_pretrain.py", "--config-file", "{tmp}/bad.yaml"],
        "bad.yaml:4:2: invalid YAML: expected ',' or ']'",
    ),
    "pretrain-unknown-key": ([*PRETRAIN, "{tiny}", "SOLVER.BASE_LRR", "0.1"], "SOLVER.BASE_LRR"),
    "pretrain-float-for-int": ([*PRETRAIN, "{tiny}", "SOLVER.MAX_ITER", "2.5"], "MAX_ITER"),
    "pretrain-odd-overrides": ([*PRETRAIN, "{tiny}", "SOLVER.BASE_LR"], "KEY VALUE pairs"),
    "pretrain-bad-value": ([*PRETRAIN, "{tiny}", "LOSS.TAU", "0.0"], "LOSS.TAU = 0.0"),
    "pretrain-cuda-without-gpu": ([*PRETRAIN, "{tiny}", "MODEL.DEVICE", "cuda"], "CUDA"),
    "pretrain-missing-data-root": (
        [*PRETRAIN, "{tiny}", "DATASETS.ROOT", "{tmp}/nowhere"],
        "nowhere': no such directory",
    ),
    "pretrain-knn-root-without-val": (
        [*PRETRAIN, "{tiny}", "TEST.KNN_PERIOD", "3", "TEST.KNN_ROOT", "{half}"],
        "half': no val/ folder of labelled images for the kNN monitor",
    ),
    # the demo: its data layouts and options
    "demo-train-without-val": (
        [*DEMO, *IMAGEFOLDER, "DATASETS.ROOT", "{half}"],
        "has train/ but no val/",
    ),
    "demo-split-beside-classes": (
        [*DEMO, *IMAGEFOLDER, "DATASETS.ROOT", "{mixed}"],
        "has train/ and val/ beside other folders",
    ),
    "demo-missing-image-root": (
        [*DEMO, *IMAGEFOLDER, "DATASETS.ROOT", "{tmp}/nowhere"],
        "no such directory",
    ),
    "demo-missing-fashion-mnist": ([*DEMO, "DATASETS.ROOT", "{tmp}/nowhere"], "nowhere"),
    "demo-no-references": ([*DEMO, "--knn-train", "0"], "--knn-train and --knn-test must be >= 1"),
    "demo-unknown-key": ([*DEMO, "SOLVER.BASE_LRR", "1"], "SOLVER.BASE_LRR"),
    # the converters
    "convert-missing-input": ([D2, "{tmp}/nowhere.pth", "{tmp}/out.pkl"], "nowhere.pth"),
    "convert-onto-its-input": ([D2, "{ckpt}", "{ckpt}"], "is the input checkpoint"),
    "convert-bad-suffix": ([D2, "{ckpt}", "{tmp}/out.txt"], "must end in .pkl or .pth"),
    "convert-not-a-checkpoint": ([D2, "{tmp}/bad.yaml", "{tmp}/out.pkl"], "bad.yaml"),
    "export-onto-its-input": ([EXPORT, "{ckpt}", "{ckpt}"], "is the input checkpoint"),
    "export-missing-input": ([EXPORT, "{tmp}/nowhere.pth", "{tmp}/o.pth"], "nowhere.pth"),
    "export-safetensors-name": ([EXPORT, "--safetensors", "{ckpt}", "{tmp}/o.pth"], ".safetensors"),
    # SLURM submission, checked without a cluster
    "submit-no-nodes": ([*SUBMIT[:2], "--nodes", "0", *SUBMIT[2:]], "--nodes must be >= 1"),
    # a real submission (no --dry-run): its data checked before a job waits in a queue
    "submit-missing-data": (
        [
            "tools/submit_pretrain.py",
            "--config-file",
            DEMO_CONFIG,
            "--gpus-per-node",
            "0",
            "OUTPUT_DIR",
            "{tmp}/run",
            "DATASETS.ROOT",
            "{tmp}/nowhere",
        ],  # fmt: skip
        "DATASETS.ROOT",
    ),
    "submit-missing-config": (
        ["tools/submit_pretrain.py", "--dry-run", "--config-file", "{tmp}/nowhere.yaml"],
        "nowhere.yaml",
    ),
}


def _fill(argv: list[str], tmp: Path) -> list[str]:
    """The row's arguments with its placeholders made real (data, files) under ``tmp``."""
    data = tmp / "data"
    if not data.exists():
        make_image_folder(data, classes=2, per_class=4, size=16)
        make_image_folder(tmp / "half" / "train", classes=2, per_class=2, size=16)
        make_image_folder(tmp / "mixed" / "train", classes=2, per_class=2, size=16)
        make_image_folder(tmp / "mixed" / "val", classes=2, per_class=2, size=16)
        make_image_folder(tmp / "mixed", classes=1, per_class=2, size=16)  # mixed/class0
        (tmp / "bad.yaml").write_text(f'_BASE_: "{DEMO_CONFIG}"\nSOLVER:\n  BASE_LR: [0.1\nX: 1\n')
        q, k = torchvision.models.resnet18(), torchvision.models.resnet18()
        state = pre("encoder_q.", q.state_dict()) | pre("encoder_k.", k.state_dict())
        torch.save({"state_dict": state}, tmp / "moco.pth")
    tiny = [o for o in tiny_opts(data, tmp / "run") if o != "cuda"]
    out: list[str] = []
    for arg in argv:
        if arg == "{tiny}":
            out += tiny
            continue
        out.append(
            arg.replace("{tmp}", str(tmp))
            .replace("{half}", str(tmp / "half"))
            .replace("{mixed}", str(tmp / "mixed"))
            .replace("{ckpt}", str(tmp / "moco.pth"))
        )
    return out


@pytest.mark.parametrize("row", list(ROWS))
def test_user_mistake(tmp_path, row):
    argv, match = ROWS[row]
    argv = _fill(argv, tmp_path)
    before = snapshot(tmp_path)
    result = run_tool(argv, CUDA_VISIBLE_DEVICES="")
    assert_user_error(result, before, tmp_path, match=match)
    assert "torch.jit.script" not in result.output, result.output
