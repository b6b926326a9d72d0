"""User mistakes in every tool they reach: an output directory that is a file, under a file or
not writable; a ``_BASE_`` that does not exist; overrides that are not KEY VALUE pairs once the
tool adds its own; numbers out of range, mistyped options, missing values and checkpoints the
reader refuses. Each ends in exit 2, exactly one ``error:`` line, no traceback, and nothing
written or changed (tests/helpers/mistakes.py).

One row per mistake and tool: ``(tool, arguments, text the error line must contain)``, every
other argument valid. The rows run the tool's ``main`` in this process (:func:`run_main`): the
exit status and the line are those a shell sees, as the row also run in a real process
(:func:`run_tool`) shows. Placeholders: ``{tmp}`` the row's directory (everything under it must
stay as it was), ``{file}`` a file in it, ``{ro}`` a directory in it that ``os.access`` reports
read-only (the tests run as root, for whom a mode bit does not make a directory unwritable),
``{badbase}`` a config whose ``_BASE_`` is missing and ``{mid}`` one whose base is
``{badbase}``; data: ``{images}`` class folders, ``{imagenet}`` train/ and val/ class folders,
``{split}`` a label split of it, ``{transfer}`` the DTD transfer set, ``{run}`` a pretraining
run, ``{fm}`` Fashion-MNIST idx files, ``{coco_json}`` and ``{coco_images}`` a COCO set;
checkpoints: ``{cut}`` a MoCo checkpoint cut off half-way, ``{detector}`` a fine-tuned
detectron2 detector (its ResNet's stride placement unknown).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers import ROOT, make_image_folder, tiny_opts
from tests.helpers.analysis import make_fashion_mnist, make_run
from tests.helpers.checkpoints import bb, d2_names, pre
from tests.helpers.classification import (  # noqa: F401 (no_md5: a fixture)
    IMAGENET_CLASSES,
    QUICK,
    make_dtd,
    make_imagenet,
    no_md5,
)
from tests.helpers.mistakes import assert_user_error, run_main, run_tool, snapshot
from tests.transfer.detection.test_detection_train import make_coco
from transfer.classification.demo import DEMO_CONFIG

PRETRAIN = ["train_pretrain", "--config-file", DEMO_CONFIG, "{tiny}", "MODEL.DEVICE", "cpu"]
KNN = ["knn_eval", "--random-init", "resnet18", "--dataset", "imagefolder", "--data-root",
       "{imagenet}", "--num-workers", "0"]  # fmt: skip
LINEAR = ["linear_probe", "--config-file", f"{QUICK}/linear_instant.yaml", "--random-init",
          "resnet18", "--data-root", "{imagenet}", "--device", "cpu"]  # fmt: skip
TRANSFER = ["transfer_linear", "--config-file", f"{QUICK}/transfer_instant.yaml",
            "--random-init", "resnet18", "--data-root", "{transfer}",
            "--datasets", "dtd"]  # fmt: skip
SEMI = ["semi_supervised", "--config-file", f"{QUICK}/semi_instant.yaml", "--random-init",
        "resnet18", "--data-root", "{imagenet}", "--split-file", "{split}"]  # fmt: skip
ANALYZE = ["analyze_nuclear_norm", "{run}", "--dataset", "imagefolder", "--data-root",
           "{imagenet}", "--max-images", "2", "--views", "2", "--num-workers", "0"]  # fmt: skip
DEMO = ["demo", "DATASETS.TYPE", "imagefolder", "DATASETS.ROOT", "{images}"]
STUDY = ["study", "--results", "{tmp}/docs/results.md", "--seeds", "0", "--methods", "lorac",
         "--jobs", "1", "{tiny_fm}"]  # fmt: skip
SUBMIT = ["submit_pretrain", "--local", "--config-file", DEMO_CONFIG, "--gpus-per-node", "0",
          "MODEL.DEVICE", "cpu", "DATASETS.TYPE", "imagefolder",
          "DATASETS.ROOT", "{images}"]  # fmt: skip
DETECTION = ["train_net", "--config-file", str(ROOT / "configs" / "coco_faster_rcnn_lorac.yaml"),
             "--register-coco", "mistakes", "{coco_json}", "{coco_images}", "MODEL.DEVICE",
             "cpu",
             "DATASETS.TRAIN", "('mistakes',)", "DATASETS.TEST", "('mistakes',)",
             "MODEL.ROI_HEADS.NUM_CLASSES", "2", "MODEL.WEIGHTS", ""]  # fmt: skip
A_FILE = "is a file, not a directory"
UNDER_A_FILE = "cannot be created: {file} is not a directory"
BASE = "badbase.yaml: _BASE_ 'nowhere.yaml': no such config file"

ROWS = {
    # an output directory that is a file (FileExistsError / NotADirectoryError tracebacks)
    "pretrain-output-dir-a-file": ([*PRETRAIN, "OUTPUT_DIR", "{file}"],
                                   f"OUTPUT_DIR {{file}} {A_FILE}"),
    "knn-output-dir-a-file": ([*KNN, "--output-dir", "{file}"], f"--output-dir {{file}} {A_FILE}"),
    "linear-output-dir-under-a-file": ([*LINEAR, "--output-dir", "{file}/run"], UNDER_A_FILE),
    "linear-table-dir-a-file": ([*LINEAR, "--output-dir", "{tmp}/run", "--table-dir", "{file}"],
                                f"--table-dir {{file}} {A_FILE}"),
    "transfer-output-dir-a-file": ([*TRANSFER, "--output-dir", "{file}"], A_FILE),
    "semi-output-dir-a-file": ([*SEMI, "--output-dir", "{file}"], A_FILE),
    "analyze-out-a-file": ([*ANALYZE, "--out", "{file}"], f"--out {{file}} {A_FILE}"),
    "demo-output-dir-a-file": ([*DEMO[:1], "--output-dir", "{file}", *DEMO[1:]], A_FILE),
    "study-output-dir-a-file": ([*STUDY[:1], "--output-dir", "{file}", *STUDY[1:]], A_FILE),
    "report-out-a-file": (["make_report", "--eval-dir", "{tmp}", "--out", "{file}"], A_FILE),
    "submit-output-dir-a-file": ([*SUBMIT, "OUTPUT_DIR", "{file}"], UNDER_A_FILE),
    "detection-output-dir-a-file": ([*DETECTION, "OUTPUT_DIR", "{file}"], A_FILE),
    # an output directory that is not writable, or under one
    "pretrain-output-dir-read-only": ([*PRETRAIN, "OUTPUT_DIR", "{ro}"], "{ro} is not writable"),
    "knn-output-dir-under-read-only": (
        [*KNN, "--output-dir", "{ro}/knn"],
        "--output-dir {ro}/knn cannot be created: {ro} is not writable",
    ),
    # a _BASE_ that does not exist ("error: <file>: 2")
    "pretrain-missing-base": (["train_pretrain", "--config-file", "{badbase}"], BASE),
    "pretrain-missing-base-of-a-base": (["train_pretrain", "--config-file", "{mid}"], BASE),
    "linear-missing-base": ([*LINEAR, "--output-dir", "{tmp}/run", "--config-file", "{badbase}"],
                            BASE),
    "detection-missing-base": (["train_net", "--config-file", "{badbase}"], BASE),
    # overrides that are not pairs: the line lists what the user typed, not the tool's own keys
    "linear-odd-overrides": ([*LINEAR, "--output-dir", "{tmp}/run", "SOLVER.BASE_LR"],
                             "got ['SOLVER.BASE_LR']"),
    "transfer-odd-overrides": ([*TRANSFER, "--output-dir", "{tmp}/run", "TRANSFER.NUM_LRS"],
                               "got ['TRANSFER.NUM_LRS']"),
    "demo-odd-overrides": ([*DEMO, "--output-dir", "{tmp}/demo", "SOLVER.BASE_LR"],
                           "got ['DATASETS.TYPE', 'imagefolder', 'DATASETS.ROOT', "),
    # numbers out of range, checked as the command line is read
    "knn-no-neighbours": ([*KNN, "--output-dir", "{tmp}/knn", "--k", "0"],
                          "argument --k: must be >= 1, got 0"),
    "knn-negative-temperature": ([*KNN, "--output-dir", "{tmp}/knn", "--temperature", "-0.07"],
                                 "argument --temperature: must be a number > 0, got -0.07"),
    "detection-negative-lr": ([*DETECTION, "OUTPUT_DIR", "{tmp}/det", "SOLVER.BASE_LR", "-0.02"],
                              "SOLVER.BASE_LR = -0.02: must be > 0"),
    "linear-no-processes": ([*LINEAR, "--output-dir", "{tmp}/run", "--num-gpus", "0"],
                            "argument --num-gpus: must be >= 1, got 0"),
    "embedding-too-few-images": (["plot_embedding", "{run}", "--images", "2"],
                                 "--images 2: t-SNE needs at least 4 images"),
    "report-too-few-embedding-images": (
        ["make_report", "{run}", "--out", "{tmp}/report", "--embedding-images", "3"],
        "--embedding-images 3: 0 (no picture) or at least 4 (t-SNE)"),
    # a recipe that cannot work on this number of processes (pretrain/config/world_size.py)
    "pretrain-batch-not-shared-by-the-reference-world-size": (
        [*PRETRAIN, "OUTPUT_DIR", "{tmp}/o", "SOLVER.REFERENCE_WORLD_SIZE", "3"],
        "SOLVER.IMS_PER_BATCH = 8 is not divisible by SOLVER.REFERENCE_WORLD_SIZE = 3"),
    "embedding-no-run": (["plot_embedding", "{tmp}/nowhere"],
                         "{tmp}/nowhere: no such run directory or checkpoint file"),
    # a mistyped option: named with the closest one, wherever it stands
    "knn-mistyped-required-option": (
        [*KNN, "--outptu-dir", "{tmp}/knn"],
        "unrecognized option --outptu-dir; did you mean --output-dir?"),
    "detection-mistyped-option-after-overrides": (
        [*DETECTION, "OUTPUT_DIR", "{tmp}/det", "--resum"],
        "unrecognized option --resum; did you mean --resume?"),
    # a value named by the flag that gives it
    "semi-one-image-per-batch": ([*SEMI, "--output-dir", "{tmp}/semi", "SOLVER.BATCH_SIZE", "1"],
                                 "SOLVER.BATCH_SIZE = 1: must be at least 2 (2 images)"),
    "semi-without-split-file": ([*SEMI[:-2], "--output-dir", "{tmp}/semi"],
                                "--split-file is missing"),
    "transfer-unknown-dataset": ([*TRANSFER[:-1], "dtdx", "--output-dir", "{tmp}/run"],
                                 "argument --datasets: unknown name 'dtdx'; did you mean dtd?"),
    # checkpoints the one reader refuses, for every tool
    "knn-truncated-checkpoint": (["knn_eval", "--checkpoint", "{cut}", *KNN[3:], "--output-dir",
                                  "{tmp}/knn"], "cut.pth: incomplete checkpoint, truncated"),
    "linear-truncated-checkpoint": ([*LINEAR[:3], "--checkpoint", "{cut}", *LINEAR[5:],
                                     "--output-dir", "{tmp}/run"], "incomplete checkpoint"),
    "knn-detector-checkpoint": (["knn_eval", "--checkpoint", "{detector}", *KNN[3:],
                                 "--output-dir", "{tmp}/knn"], "__author__ None"),
}  # fmt: skip
# a row also run in a real process, as a shell runs it
IN_A_PROCESS = ["pretrain-output-dir-a-file"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("data")
    json_file, image_root = make_coco(root / "coco")
    images = make_image_folder(root / "images", classes=2, per_class=4, size=16)
    imagenet = make_imagenet(str(root / "imagenet"))
    split = root / "1percent.txt"
    split.write_text("".join(f"{c}_{i}.JPEG\n" for c in IMAGENET_CLASSES for i in range(2)))
    make_dtd(str(root / "transfer" / "dtd"))
    net = torchvision.models.resnet18()
    torch.save({"state_dict": pre("module.encoder_q.", net.state_dict())}, root / "cut.pth")
    whole = (root / "cut.pth").read_bytes()
    (root / "cut.pth").write_bytes(whole[: len(whole) // 2])
    detector = {k: torch.as_tensor(v) for k, v in d2_names(bb(net), "backbone.bottom_up.").items()}
    detector |= {"roi_heads.box_predictor.cls_score.weight": torch.zeros(3, 8)}
    torch.save({"model": detector, "iteration": 90000}, root / "detector.pth")
    return {
        "{cut}": str(root / "cut.pth"),
        "{detector}": str(root / "detector.pth"),
        "{images}": str(images),
        "{imagenet}": imagenet,
        "{split}": str(split),
        "{transfer}": str(root / "transfer"),
        "{run}": str(make_run(root / "run", images, seed=0)),
        "{fm}": str(make_fashion_mnist(root / "fm", n_train=40, n_test=20)),
        "{coco_json}": json_file,
        "{coco_images}": image_root,
    }


def _fill(argv: list[str], tmp: Path, data: dict[str, str]) -> list[str]:
    """The row's arguments with its placeholders made real under ``tmp``."""
    (tmp / "file").write_text("a file where a directory should be\n")
    (tmp / "ro").mkdir()
    (tmp / "badbase.yaml").write_text("_BASE_: nowhere.yaml\nSEED: 1\n")
    (tmp / "mid.yaml").write_text("_BASE_: badbase.yaml\n")
    tiny = tiny_opts(Path(data["{images}"]), tmp / "run")
    tiny_fm = tiny_opts(Path(data["{fm}"]), tmp / "run", **{"DATASETS.TYPE": "fashion_mnist"})
    out: list[str] = []
    for arg in argv:
        if arg in ("{tiny}", "{tiny_fm}"):
            out += tiny if arg == "{tiny}" else tiny_fm
            continue
        for key, value in data.items():
            arg = arg.replace(key, value)
        out.append(fill_names(arg, tmp))
    return out


def fill_names(text: str, tmp: Path) -> str:
    for name in ("file", "ro", "badbase", "mid"):
        suffix = ".yaml" if name in ("badbase", "mid") else ""
        text = text.replace(f"{{{name}}}", str(tmp / f"{name}{suffix}"))
    return text.replace("{tmp}", str(tmp))


@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """``os.access`` says ``tmp_path/ro`` (and everything under it) cannot be written: what a
    read-only mount or a directory of another user looks like, which root cannot make."""
    real = os.access
    ro = str(tmp_path / "ro")

    def access(path, mode, *args, **kwargs):
        inside = os.path.abspath(path) == ro or os.path.abspath(path).startswith(ro + os.sep)
        if inside and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _main(tool: str):
    package = "pretrain.cli" if tool in ("train_pretrain", "submit_pretrain") else "transfer.cli"
    return importlib.import_module(f"{package}.{tool}").main


@pytest.mark.parametrize("row", list(ROWS))
def test_mistake_is_one_error_line(row, tmp_path, data, read_only, no_md5, monkeypatch):  # noqa: F811
    argv, match = ROWS[row]
    tool, *argv = _fill(argv, tmp_path, data)
    monkeypatch.chdir(tmp_path)  # the tools' relative default paths stay in the row's directory
    before = snapshot(tmp_path)
    result = run_main(_main(tool), argv)
    assert_user_error(result, before, tmp_path, match=fill_names(match, tmp_path))


@pytest.mark.parametrize("row", IN_A_PROCESS)
def test_mistake_in_a_real_process(row, tmp_path, data):
    argv, match = ROWS[row]
    tool, *argv = _fill(argv, tmp_path, data)
    before = snapshot(tmp_path)
    result = run_tool([f"tools/{tool}.py", *argv], cwd=tmp_path, CUDA_VISIBLE_DEVICES="")
    assert_user_error(result, before, tmp_path, match=fill_names(match, tmp_path))
