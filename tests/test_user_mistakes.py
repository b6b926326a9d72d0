"""Plausible mistakes with the pretraining-side tools, the demo and the weight converters:
each ends in exit 2, exactly one ``error:`` line, no traceback, and nothing written or changed
(tests/helpers/mistakes.py), and no ``torch.jit.script`` deprecation noise.

One row per mistake: ``(tool and arguments, text the error line must contain)``. The files every
row reads are written once for the module (``{tiny}`` the overrides of a seconds-long run on a
small image folder, ``{half}`` an image folder with ``train/`` only, ``{mixed}`` one with
``train/`` and ``val/`` beside a class folder, ``{empty}`` an empty folder, ``{flat}`` images
without class folders, ``{bad}`` a YAML syntax error, ``{inf}`` a config spelling infinity as
YAML does not, ``{ckpt}`` a MoCo-style checkpoint, ``{cut}`` a run whose last checkpoint is
truncated, ``{cut_ckpt}`` that checkpoint); ``{tmp}`` is the row's directory. Everything under
``{tmp}`` and the shared files must stay as they were.

A row runs the tool's ``main`` in this process (:func:`run_main`), except the rows of
:data:`IN_A_PROCESS`, one per tool, which run ``tools/<tool>.py`` as a shell runs it: what only a
process shows (the entry point, an interpreter that starts by importing the tool, whose
``torch.jit.script`` warning is filtered by the tool and not by pytest, and
``CUDA_VISIBLE_DEVICES`` read when CUDA starts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from pretrain.config.defaults import load_config
from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.checkpoints import pre
from tests.helpers.mistakes import assert_user_error, run_main, run_tool, snapshot, tool_main
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
        ["tools/train_pretrain.py", "--config-file", "{bad}"],
        "bad.yaml:4:2: invalid YAML: expected ',' or ']'",
    ),
    "pretrain-unknown-key": ([*PRETRAIN, "{tiny}", "SOLVER.BASE_LRR", "0.1"], "SOLVER.BASE_LRR"),
    "pretrain-float-for-int": ([*PRETRAIN, "{tiny}", "SOLVER.MAX_ITER", "2.5"], "MAX_ITER"),
    "pretrain-odd-overrides": ([*PRETRAIN, "{tiny}", "SOLVER.BASE_LR"], "KEY VALUE pairs"),
    "pretrain-bad-value": ([*PRETRAIN, "{tiny}", "LOSS.TAU", "0.0"], "LOSS.TAU = 0.0"),
    # values checked with the config, before the run directory is created (a ValueError
    # traceback with config.yaml, env.txt and log.txt left behind; a constant head trained)
    "pretrain-unknown-arch": (
        [*PRETRAIN, "{tiny}", "MODEL.ARCH", "resnet-50"],
        "MODEL.ARCH = 'resnet-50': must be one of ('resnet18', 'resnet34', 'resnet50'",
    ),
    "pretrain-zero-head-hidden-dim": (
        [*PRETRAIN, "{tiny}", "MODEL.HEAD_HIDDEN_DIM", "0"],
        "MODEL.HEAD_HIDDEN_DIM = 0: must be >= 1",
    ),
    "pretrain-zero-head-out-dim": (
        [*PRETRAIN, "{tiny}", "MODEL.HEAD_OUT_DIM", "0"],
        "MODEL.HEAD_OUT_DIM = 0: must be >= 1",
    ),
    "pretrain-cuda-without-gpu": ([*PRETRAIN, "{tiny}", "MODEL.DEVICE", "cuda"], "CUDA"),
    "pretrain-missing-data-root": (
        [*PRETRAIN, "{tiny}", "DATASETS.ROOT", "{tmp}/nowhere"],
        "nowhere': no such directory",
    ),
    "pretrain-yaml-inf": (
        ["tools/train_pretrain.py", "--config-file", "{inf}"],
        "LOSS.BETA; YAML spells infinity .inf, not inf",
    ),
    # train_pretrain: the command line, wherever a mistyped option stands
    "pretrain-mistyped-option-after-overrides": (
        [*PRETRAIN, "{tiny}", "--resume-with-change"],
        "unrecognized option --resume-with-change; did you mean --resume-with-changes?",
    ),
    "pretrain-mistyped-option-before-overrides": (
        ["tools/train_pretrain.py", "--confg-file", DEMO_CONFIG, "{tiny}"],
        "unrecognized option --confg-file; did you mean --config-file?",
    ),
    # train_pretrain: processes and data, checked before the run directory is written or workers
    # start
    "pretrain-no-processes": (
        [*PRETRAIN, "--num-gpus", "0", "{tiny}"],
        "argument --num-gpus: must be >= 1, got 0",
    ),
    "pretrain-batch-not-split-by-processes": (
        [*PRETRAIN, "--num-gpus", "3", "{tiny}"],
        "SOLVER.IMS_PER_BATCH = 8: must be divisible by the number of processes (3)",
    ),
    "pretrain-one-image-per-process": (
        [*PRETRAIN, "{tiny}", "SOLVER.IMS_PER_BATCH", "1"],
        "SOLVER.IMS_PER_BATCH = 1: must be at least 2 (2 images)",
    ),
    "pretrain-one-image-on-each-of-two-processes": (
        [*PRETRAIN, "--num-gpus", "2", "{tiny}", "SOLVER.IMS_PER_BATCH", "2"],
        "SOLVER.IMS_PER_BATCH = 2: must be at least 4 (2 images x 2 processes)",
    ),
    "pretrain-empty-imagefiles-root": (
        [*PRETRAIN, "{tiny}", "DATASETS.TYPE", "imagefiles", "DATASETS.ROOT", "{empty}"],
        "no image files in it or its subfolders",
    ),
    "pretrain-batch-larger-than-dataset": (
        [*PRETRAIN, "{tiny}", "SOLVER.IMS_PER_BATCH", "16", "MODEL.QUEUE_SIZE", "32"],
        "SOLVER.IMS_PER_BATCH = 16 exceeds the dataset size (8 images",
    ),
    "pretrain-imagefolder-without-classes": (
        [*PRETRAIN, "{tiny}", "DATASETS.ROOT", "{flat}"],
        "not an image folder: no class folders",
    ),
    "pretrain-resume-from-truncated-checkpoint": (
        [*PRETRAIN, "{tiny}", "OUTPUT_DIR", "{cut}"],
        "model_0000002.pth, the checkpoint {cut}/last_checkpoint names, is truncated",
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
    "convert-not-a-checkpoint": ([D2, "{bad}", "{tmp}/out.pkl"], "bad.yaml"),
    "convert-truncated-checkpoint": (
        [D2, "{cut_ckpt}", "{tmp}/out.pkl"],
        "incomplete checkpoint, truncated",
    ),
    "export-truncated-checkpoint": (
        [EXPORT, "{cut_ckpt}", "{tmp}/o.pth"],
        "incomplete checkpoint, truncated",
    ),
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


# one row per tool in a real process; the CUDA row must be one (CUDA_VISIBLE_DEVICES is read when
# CUDA starts, once per process: in this one, a GPU machine's GPU would be visible)
IN_A_PROCESS = [
    "pretrain-cuda-without-gpu",
    "demo-train-without-val",
    "convert-onto-its-input",
    "export-missing-input",
    "submit-missing-data",
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """The files the rows read (no row may change them): image folders, a YAML file with a
    syntax error, a MoCo-style checkpoint."""
    root = tmp_path_factory.mktemp("shared")
    make_image_folder(root / "data", classes=2, per_class=4, size=16)
    make_image_folder(root / "half" / "train", classes=2, per_class=2, size=16)
    make_image_folder(root / "mixed" / "train", classes=2, per_class=2, size=16)
    make_image_folder(root / "mixed" / "val", classes=2, per_class=2, size=16)
    make_image_folder(root / "mixed", classes=1, per_class=2, size=16)  # mixed/class0
    (root / "bad.yaml").write_text(f'_BASE_: "{DEMO_CONFIG}"\nSOLVER:\n  BASE_LR: [0.1\nX: 1\n')
    (root / "inf.yaml").write_text(f'_BASE_: "{DEMO_CONFIG}"\nLOSS:\n  BETA: inf\n')
    (root / "empty").mkdir()
    flat = make_image_folder(root / "flat", classes=1, per_class=3, size=16) / "class0"
    for image in flat.iterdir():
        image.rename(root / "flat" / image.name)
    flat.rmdir()
    # a run stopped by a full disk: its config, and a last checkpoint cut off half-way
    cut = root / "cut"
    cut.mkdir()
    cfg = load_config(DEMO_CONFIG, tiny_opts(root / "data", cut))
    (cut / "config.yaml").write_text(cfg.dump())
    torch.save({"model": {"w": torch.zeros(4096)}, "iteration": 2}, cut / "model_0000002.pth")
    data = (cut / "model_0000002.pth").read_bytes()
    (cut / "model_0000002.pth").write_bytes(data[: len(data) // 2])
    (cut / "last_checkpoint").write_text("model_0000002.pth")
    q, k = torchvision.models.resnet18(), torchvision.models.resnet18()
    state = pre("encoder_q.", q.state_dict()) | pre("encoder_k.", k.state_dict())
    torch.save({"state_dict": state}, root / "moco.pth")
    return root


def _fill(argv: list[str], tmp: Path, shared: Path) -> list[str]:
    """The row's arguments with its placeholders made real."""
    tiny = [o for o in tiny_opts(shared / "data", tmp / "run") if o != "cuda"]
    out: list[str] = []
    for arg in argv:
        if arg == "{tiny}":
            out += tiny
            continue
        out.append(
            arg.replace("{tmp}", str(tmp))
            .replace("{half}", str(shared / "half"))
            .replace("{mixed}", str(shared / "mixed"))
            .replace("{bad}", str(shared / "bad.yaml"))
            .replace("{ckpt}", str(shared / "moco.pth"))
            .replace("{cut_ckpt}", str(shared / "cut" / "model_0000002.pth"))
            .replace("{cut}", str(shared / "cut"))
            .replace("{inf}", str(shared / "inf.yaml"))
            .replace("{empty}", str(shared / "empty"))
            .replace("{flat}", str(shared / "flat"))
        )
    return out


@pytest.mark.parametrize("row", list(ROWS))
def test_user_mistake(tmp_path, shared, row):
    argv, match = ROWS[row]
    script, *args = _fill(argv, tmp_path, shared)
    before = snapshot(tmp_path, shared)
    if row in IN_A_PROCESS:
        result = run_tool([script, *args], CUDA_VISIBLE_DEVICES="")
    else:
        result = run_main(tool_main(script), args)
    assert_user_error(result, before, tmp_path, shared, match=_fill([match], tmp_path, shared)[0])
    assert "torch.jit.script" not in result.output, result.output


def test_every_tool_has_a_row_in_a_real_process():
    tools = {ROWS[row][0][0] for row in IN_A_PROCESS}
    assert tools == {argv[0] for argv, _ in ROWS.values()}
    assert len(tools) == len(IN_A_PROCESS)
