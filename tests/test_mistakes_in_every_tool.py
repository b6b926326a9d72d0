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

Other tools' runs, copied into the row's directory (so that every one of their files must stay
byte-identical): ``{prun}`` a finished pretraining run made before runs recorded their owner
(config.yaml, model_final.pth, last_checkpoint, metrics.json), ``{knnrun}`` a kNN evaluation
(its owner recorded), ``{linrun}`` a finished linear probe made before owners were recorded,
``{tabrun}`` and ``{tablin}`` an unfinished pretraining run and linear probe whose config.yaml
was hand-edited with a tab. Configs: ``{loop}`` a config whose ``_BASE_`` chain loops,
``{latin}`` one saved as Latin-1, ``{long}`` a folder name of 300 characters.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest
import torch
import torchvision

from pretrain.config.defaults import load_config
from pretrain.utils.run_owner import OWNER_FILE
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
from transfer.classification.config import linear_probe_defaults
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
OWNED = "{prun} holds a pretraining run (tools/train_pretrain.py; config.yaml"
NOT_YOURS = "with or without --overwrite"
LOOP = "makes a loop of bases"
LATIN = "latin.yaml:2:6: not UTF-8 text: byte 0xe9 (as Latin-1 it reads 'é'); save the file"
CKPT_AS_CONFIG = "model_final.pth is not a YAML config: it looks like a checkpoint"
TAB = "config.yaml:3:1: invalid YAML: found character '\\t' that cannot start any token"
LONG = "is 300 bytes long, over this filesystem's limit of 255"

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
    "submit-output-dir-a-file": ([*SUBMIT, "OUTPUT_DIR", "{file}"],
                                 f"OUTPUT_DIR {{file}} {A_FILE}"),
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
    # another tool's run, with --overwrite (or --resume): refused, every file left as it was
    # (it deleted the pretraining run's checkpoints, config, metrics and events)
    "knn-overwrite-pretraining-run": ([*KNN, "--output-dir", "{prun}", "--overwrite"], OWNED),
    "knn-into-pretraining-run": ([*KNN, "--output-dir", "{prun}"], NOT_YOURS),
    "linear-overwrite-pretraining-run": ([*LINEAR, "--output-dir", "{prun}", "--overwrite"],
                                         OWNED),
    "linear-resume-pretraining-run": ([*LINEAR, "--output-dir", "{prun}", "--resume"], OWNED),
    "semi-overwrite-pretraining-run": ([*SEMI, "--output-dir", "{prun}", "--overwrite"], OWNED),
    "transfer-overwrite-pretraining-run": ([*TRANSFER, "--output-dir", "{prun}", "--overwrite"],
                                           OWNED),
    "analyze-overwrite-pretraining-run": ([*ANALYZE, "--out", "{prun}", "--overwrite"], OWNED),
    "detection-overwrite-pretraining-run": ([*DETECTION, "OUTPUT_DIR", "{prun}", "--overwrite"],
                                            OWNED),
    "detection-resume-pretraining-run": ([*DETECTION, "OUTPUT_DIR", "{prun}", "--resume"], OWNED),
    "study-into-pretraining-run": ([*STUDY[:1], "--output-dir", "{prun}", *STUDY[1:]], OWNED),
    "report-into-pretraining-run": (["make_report", "{run}", "--out", "{prun}"], OWNED),
    "knn-overwrite-linear-probe": ([*KNN, "--output-dir", "{linrun}", "--overwrite"],
                                   "holds a linear-probe run (tools/linear_probe.py"),
    "pretrain-into-knn-run": ([*PRETRAIN, "OUTPUT_DIR", "{knnrun}"],
                              "holds a kNN evaluation (tools/knn_eval.py"),
    "demo-into-knn-run": ([*DEMO[:1], "--output-dir", "{knnrun}", *DEMO[1:]],
                          "holds a kNN evaluation"),
    "submit-into-knn-run": ([*SUBMIT, "OUTPUT_DIR", "{knnrun}"], "holds a kNN evaluation"),
    "linear-overwrite-knn-run": ([*LINEAR, "--output-dir", "{knnrun}", "--overwrite"],
                                 "tools/linear_probe.py writes only into its own runs"),
    # an output path that is empty, or a folder name longer than the filesystem allows
    "pretrain-output-dir-empty": ([*PRETRAIN, "OUTPUT_DIR", ""], "OUTPUT_DIR is empty"),
    "knn-output-dir-empty": ([*KNN, "--output-dir", ""], "--output-dir is empty"),
    "demo-output-dir-empty": ([*DEMO[:1], "--output-dir", "", *DEMO[1:]], "--output-dir is empty"),
    "linear-output-dir-empty": ([*LINEAR, "--output-dir", ""], "--output-dir is empty"),
    "analyze-out-empty": ([*ANALYZE, "--out", ""], "--out is empty"),
    "study-output-dir-empty": ([*STUDY[:1], "--output-dir", "", *STUDY[1:]],
                               "--output-dir is empty"),
    "report-out-empty": (["make_report", "{run}", "--out", ""], "--out is empty"),
    "detection-output-dir-empty": ([*DETECTION, "OUTPUT_DIR", ""], "OUTPUT_DIR is empty"),
    "pretrain-output-dir-name-too-long": ([*PRETRAIN, "OUTPUT_DIR", "{tmp}/{long}"], LONG),
    "knn-output-dir-name-too-long": ([*KNN, "--output-dir", "{tmp}/{long}/knn"], LONG),
    "demo-output-dir-name-too-long": ([*DEMO[:1], "--output-dir", "{tmp}/{long}", *DEMO[1:]],
                                      LONG),
    # configs the one YAML reader refuses: bases that loop, Latin-1, a checkpoint, a tab
    "pretrain-base-loop": (["train_pretrain", "--config-file", "{loop}"], LOOP),
    "linear-base-loop": ([*LINEAR, "--output-dir", "{tmp}/run", "--config-file", "{loop}"], LOOP),
    "detection-base-loop": (["train_net", "--config-file", "{loop}"], LOOP),
    "pretrain-latin1-config": (["train_pretrain", "--config-file", "{latin}"], LATIN),
    "linear-latin1-config": ([*LINEAR, "--output-dir", "{tmp}/run", "--config-file", "{latin}"],
                             LATIN),
    "detection-latin1-config": (["train_net", "--config-file", "{latin}"], LATIN),
    "pretrain-checkpoint-as-config": (["train_pretrain", "--config-file",
                                       "{prun}/model_final.pth"], CKPT_AS_CONFIG),
    "linear-checkpoint-as-config": ([*LINEAR, "--output-dir", "{tmp}/run", "--config-file",
                                     "{prun}/model_final.pth"], CKPT_AS_CONFIG),
    "detection-checkpoint-as-config": (["train_net", "--config-file", "{prun}/model_final.pth"],
                                       CKPT_AS_CONFIG),
    "pretrain-resume-tab-in-saved-config": ([*PRETRAIN, "OUTPUT_DIR", "{tabrun}"], TAB),
    "linear-resume-tab-in-saved-config": ([*LINEAR, "--output-dir", "{tablin}", "--resume"],
                                          TAB),
    # a config of another tool: said before detectron2's "has no VERSION" warning
    "detection-pretraining-config": (
        ["train_net", "--config-file", DEMO_CONFIG],
        "is a config of a pretraining run (tools/train_pretrain.py), not of a detection run: "
        "tools/train_net.py takes the detection configs at the top of configs/ (coco_*, voc_*"),
    "detection-linear-probe-config": (
        ["train_net", "--config-file", f"{QUICK}/linear_instant.yaml"],
        "is a config of a linear-probe run (tools/linear_probe.py), not of a detection run"),
    "pretrain-detection-config": (
        ["train_pretrain", "--config-file", str(ROOT / "configs" / "coco_faster_rcnn_lorac.yaml")],
        "is a config of a detection run (tools/train_net.py), not of a pretraining run: "
        "tools/train_pretrain.py takes configs/pretrain/*.yaml"),
    # a report's RUN_DIR that is no pretraining run
    "report-linear-probe-as-pretraining-run": (
        ["make_report", "{linrun}", "--out", "{tmp}/report"],
        "{linrun} holds a linear-probe run (tools/linear_probe.py), not a pretraining run"),
}  # fmt: skip
# Every tool that writes a run directory, with a row giving it another tool's run.
TOOLS_WITH_RUN_DIRS = {"train_pretrain", "submit_pretrain", "demo", "knn_eval", "linear_probe",
                       "semi_supervised", "transfer_linear", "analyze_nuclear_norm", "train_net",
                       "study", "make_report"}  # fmt: skip
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
    _other_tools_runs(root / "runs", images)
    return {
        "{runs}": str(root / "runs"),
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


def _other_tools_runs(root: Path, images: Path) -> None:
    """The run folders of other tools (module docstring), made from files, not by training."""
    prun = root / "prun"
    prun.mkdir(parents=True)
    (prun / "config.yaml").write_text(load_config(DEMO_CONFIG, tiny_opts(images, prun)).dump())
    torch.save({"model": {"encoder_q.w": torch.zeros(4)}, "iteration": 6}, prun / "model_final.pth")
    (prun / "last_checkpoint").write_text("model_final.pth")
    (prun / "metrics.json").write_text('{"iteration": 5, "total_loss": 6.0}\n')
    knn = root / "knnrun"
    knn.mkdir()
    (knn / OWNER_FILE).write_text('{"owner": "knn_eval"}\n')
    (knn / "args.json").write_text('{"argv": ["tools/knn_eval.py"]}\n')
    (knn / "results.json").write_text('{"results": {"top1": 0.5}}\n')
    lin = root / "linrun"
    lin.mkdir()
    (lin / "config.yaml").write_text(linear_probe_defaults().dump())
    (lin / "results.json").write_text('{"results": {"top1": 0.5}}\n')
    # hand-edited with a tab (line 3 of each: an indented key), then resumed
    shutil.copytree(prun, root / "tabrun")
    tablin = root / "tablin"
    tablin.mkdir()
    (tablin / OWNER_FILE).write_text('{"owner": "linear_probe"}\n')
    (tablin / "config.yaml").write_text(linear_probe_defaults().dump())
    (tablin / "last_checkpoint").write_text("model_0000001.pth")
    for run in (root / "tabrun", tablin):
        lines = (run / "config.yaml").read_text().splitlines(keepends=True)
        assert lines[2].startswith("  "), lines[:3]
        lines[2] = "\t" + lines[2][2:]
        (run / "config.yaml").write_text("".join(lines))


def _fill(argv: list[str], tmp: Path, data: dict[str, str]) -> list[str]:
    """The row's arguments with its placeholders made real under ``tmp``."""
    for name in ("prun", "knnrun", "linrun", "tabrun", "tablin"):
        if any(f"{{{name}}}" in arg for arg in argv):
            shutil.copytree(Path(data["{runs}"]) / name, tmp / name)
    (tmp / "loop.yaml").write_text("_BASE_: loop2.yaml\nSEED: 1\n")
    (tmp / "loop2.yaml").write_text("_BASE_: loop.yaml\n")
    (tmp / "latin.yaml").write_bytes("SEED: 1\n# café\n".encode("latin-1"))
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
    for name in ("file", "ro", "badbase", "mid", "loop", "latin"):
        suffix = ".yaml" if name in ("badbase", "mid", "loop", "latin") else ""
        text = text.replace(f"{{{name}}}", str(tmp / f"{name}{suffix}"))
    for name in ("prun", "knnrun", "linrun", "tabrun", "tablin"):
        text = text.replace(f"{{{name}}}", str(tmp / name))
    return text.replace("{long}", "x" * 300).replace("{tmp}", str(tmp))


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


def test_every_tool_with_a_run_directory_refuses_another_tools_run():
    """Each tool that writes a run directory has a row pointing it at another tool's run."""
    rows = [argv for row, (argv, _) in ROWS.items() if "-into-" in row or "-overwrite-" in row]
    assert {argv[0] for argv in rows} == TOOLS_WITH_RUN_DIRS
