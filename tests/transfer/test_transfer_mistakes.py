"""The evaluation tools with plausible mistakes: exit 2, one `error:` line, no traceback, and
nothing written or changed.

``--device cuda`` on a machine without a visible GPU (``CUDA_VISIBLE_DEVICES=""``: the test
means the same on a GPU machine), and reruns into the run directory of a finished run (a
detection run and a kNN run) without ``--overwrite``, or with it but with a mistake.

The ``--device cuda`` rows run ``tools/<tool>.py`` in a real process, one per tool: CUDA reads
``CUDA_VISIBLE_DEVICES`` when it starts, once per process, and they show the entry point as a
shell runs it. The other rows run the tool's ``main`` in this process (:func:`run_main`), where a
process adds nothing; the detection rows under a dataset name of their own (``instant_shapes``,
the name of the finished run's command, may be registered in this process over other files).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers.classification import make_imagenet
from tests.helpers.mistakes import assert_user_error, run_main, run_tool, snapshot
from tests.transfer.detection.test_detection_run_dir import detection_argv, train_finished
from tests.transfer.detection.test_detection_train import make_coco
from transfer.cli import knn_eval, linear_probe, train_net, transfer_linear

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
CUDA = "CUDA is not visible"


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory) -> str:
    return make_imagenet(str(tmp_path_factory.mktemp("imagenet")))


def _knn_argv(data: str, out: Path, *extra: str) -> list[str]:
    return ["--random-init", "resnet18", "--dataset", "imagefolder", "--data-root", data,
            "--output-dir", str(out), "--resize", "32", "--crop", "32", "--num-workers", "0",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def finished(imagenet, tmp_path_factory) -> dict[str, Path]:
    """Finished run directories of tools/knn_eval.py and tools/train_net.py (left unchanged)."""
    knn = tmp_path_factory.mktemp("knn") / "run"
    assert knn_eval.main(_knn_argv(imagenet, knn)) == 0
    coco = {"shapes": make_coco(tmp_path_factory.mktemp("coco") / "shapes")}
    detection = train_finished(coco, tmp_path_factory.mktemp("detection"))
    torch.save(torchvision.models.resnet18().state_dict(), detection.parent / "r18.pth")
    return {"knn": knn, "detection": detection, "coco": coco}


def _device_cuda(tool: str, data: str, out: Path) -> list[str]:
    model = ["--random-init", "resnet18", "--output-dir", str(out), "--device", "cuda"]
    if tool == "knn_eval":
        return [*model, "--dataset", "imagefolder", "--data-root", data]
    if tool == "transfer_linear":
        return [*model, "--data-root", data, "--datasets", "dtd"]
    return [*model, "--data-root", data]


@pytest.mark.parametrize("tool", ["linear_probe", "knn_eval", "transfer_linear", "semi_supervised"])
def test_device_cuda_without_a_gpu(tool, imagenet, tmp_path):
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    r = run_tool([f"tools/{tool}.py", *_device_cuda(tool, imagenet, out)], **NO_GPU)
    assert_user_error(r, before, tmp_path, match=CUDA)


def test_transfer_missing_dataset_root_writes_nothing(tmp_path):
    out, missing = tmp_path / "out", tmp_path / "data"
    argv = ["--random-init", "resnet18", "--output-dir", str(out), "--data-root", str(missing),
            "--datasets", "dtd"]  # fmt: skip
    before = snapshot(tmp_path)
    r = run_main(transfer_linear.main, argv)
    assert_user_error(r, before, tmp_path, match=str(missing / "dtd"))


def test_knn_rerun_into_a_finished_run(imagenet, finished):
    before = snapshot(finished["knn"])
    r = run_main(knn_eval.main, _knn_argv(imagenet, finished["knn"]))
    assert_user_error(r, before, finished["knn"], match="holds a finished run (results.json")


def test_knn_overwrite_with_a_missing_data_root(imagenet, finished, tmp_path):
    before = snapshot(finished["knn"])
    argv = _knn_argv(str(tmp_path / "nowhere"), finished["knn"], "--overwrite")
    r = run_main(knn_eval.main, argv)
    assert_user_error(r, before, finished["knn"], match=str(tmp_path / "nowhere"))


def test_linear_probe_rerun_into_another_tools_run(imagenet, finished, tmp_path):
    """A linear probe pointed at the kNN run's directory: refused, naming --overwrite."""
    before = snapshot(finished["knn"])
    argv = ["--random-init", "resnet18", "--data-root", imagenet, "--output-dir",
            str(finished["knn"])]  # fmt: skip
    r = run_main(linear_probe.main, argv)
    assert_user_error(r, before, finished["knn"], match="--overwrite")


def _detection(finished: dict, *opts: str, **kw: str) -> list[str]:
    argv = detection_argv(finished["coco"], finished["detection"], *opts, **kw)
    return [arg.replace("instant_shapes", "transfer_mistakes_shapes") for arg in argv]


@pytest.mark.parametrize(
    "what,flag,weights,match",
    [
        ("rerun", "", "", "holds a finished run (results.json"),
        ("unconverted weights", "", "r18.pth", "holds a finished run"),
        ("unconverted weights --overwrite", "--overwrite", "r18.pth", "convert_to_d2.py"),
        ("missing weights --overwrite", "--overwrite", "missing.pkl", "missing.pkl: no such"),
    ],
)
def test_detection_into_a_finished_run(finished, what, flag, weights, match):
    out = finished["detection"]
    path = str(out.parent / weights) if weights else ""
    before = snapshot(out)
    r = run_main(train_net.main, _detection(finished, flag=flag, weights=path))
    assert_user_error(r, before, out, match=match)


def test_detection_device_cuda_without_a_gpu(finished, tmp_path):
    argv = detection_argv(finished["coco"], tmp_path / "fresh", "MODEL.DEVICE", "cuda")
    before = snapshot(tmp_path)
    r = run_tool(["tools/train_net.py", *argv], **NO_GPU)
    assert_user_error(r, before, tmp_path, match="torch sees no GPU")
