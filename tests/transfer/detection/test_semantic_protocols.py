"""The four semantic segmentation protocols end to end: each shipped config trains 2 iterations
through tools/train_net.py on a tiny dataset written in that dataset's real layout under a
temporary ``$DETECTRON2_DATASETS`` (read by detectron2's builtin registration, or by
transfer/detection/semantic.py for VOC12-aug), from a converted torchvision ResNet-50, and
writes finite mIoU, fwIoU, mACC and pACC to results.json.

Only sizes change, by overrides (image sizes, crop, batch, iterations, no precise-BN on the
CPU); the model, head, loss, schedule, datasets and evaluator are the shipped config's. Each run
is a process: detectron2 registers its builtin datasets from the variable when imported.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers import ROOT
from tests.helpers.segmentation import write_ade20k, write_cityscapes, write_voc12_aug
from transfer.detection.convert import convert_checkpoint
from transfer.detection.results import read_run, write_table

pytestmark = pytest.mark.protocols
RESNET = ("stem.", "res2.", "res3.", "res4.", "res5.")

# config -> (dataset writer, its splits and sizes, tiny-size overrides, test set)
CITYSCAPES_SIZES = [
    "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "128",
    "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "128", "INPUT.CROP.SIZE", "(32, 64)",
]  # fmt: skip
PROTOCOLS = {
    "cityscapes_semantic_fpn_lorac.yaml": (
        write_cityscapes,
        {"train": 2, "val": 2},
        CITYSCAPES_SIZES,
        "cityscapes_fine_sem_seg_val",
    ),
    "cityscapes_deeplab_lorac.yaml": (
        write_cityscapes,
        {"train": 2, "val": 2},
        CITYSCAPES_SIZES,
        "cityscapes_fine_sem_seg_val",
    ),
    "ade20k_semantic_fpn_lorac.yaml": (
        write_ade20k,
        {"training": 2, "validation": 2},
        [
            "INPUT.MIN_SIZE_TRAIN",
            "(48, 64)",
            "INPUT.MAX_SIZE_TRAIN",
            "96",
            "INPUT.MIN_SIZE_TEST",
            "48",
            "INPUT.MAX_SIZE_TEST",
            "96",
            "INPUT.CROP.SIZE",
            "(32, 32)",
        ],
        "ade20k_sem_seg_val",
    ),  # fmt: skip
    "voc_deeplab_lorac.yaml": (
        write_voc12_aug,
        {"train_aug": 2, "val": 2},
        [
            "INPUT.MIN_SIZE_TRAIN",
            "(24, 60)",
            "INPUT.MAX_SIZE_TRAIN",
            "96",
            "INPUT.CROP.SIZE",
            "(32, 32)",
        ],  # tests at the images' own odd sizes (MIN_SIZE_TEST 0)
        "voc_2012_sem_seg_val",
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """A torchvision ResNet-50 (random) converted once: the file every config loads."""
    d = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet50().state_dict(), d / "r50.pth")
    convert_checkpoint(str(d / "r50.pth"), str(d / "r50.pkl"))
    return str(d / "r50.pkl")


def _train_net(config: str, datasets: Path, output_dir: Path, *opts: str):
    argv = [
        sys.executable, str(ROOT / "tools" / "train_net.py"),
        "--config-file", str(ROOT / "configs" / config),
        "MODEL.DEVICE", "cpu", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "2",
        "TEST.PRECISE_BN.ENABLED", "False", "DATALOADER.NUM_WORKERS", "0",
        "OUTPUT_DIR", str(output_dir), *opts,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DETECTRON2_DATASETS": str(datasets)}
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture(scope="module")
def runs(weights, tmp_path_factory) -> Callable[[str], tuple[Path, Path]]:
    """``run(config)``: the tiny dataset and the finished 2-iteration run of ``config`` (each
    trained once per module)."""
    done: dict[str, tuple[Path, Path]] = {}

    def run(config: str) -> tuple[Path, Path]:
        if config not in done:
            writer, sizes, opts, _ = PROTOCOLS[config]
            root = tmp_path_factory.mktemp(config.removesuffix(".yaml"))
            writer(root / "datasets", sizes)
            out = root / "run"
            result = _train_net(config, root / "datasets", out, "MODEL.WEIGHTS", weights, *opts)
            assert result.returncode == 0, result.stderr[-4000:]
            done[config] = (root / "datasets", out)
        return done[config]

    return run


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"results.json holds {name}, which is not standard JSON")


def _sem_seg_metrics(run_dir: Path, test_set: str) -> dict[str, float | None]:
    """The run's semantic numbers, read as standard JSON (no NaN)."""
    data = json.loads((run_dir / "results.json").read_text(), parse_constant=_refuse_constant)
    return data["results"][test_set]["sem_seg"]


# config -> (head in the collector's table title, the run's "detector")
HEADS = {
    "cityscapes_semantic_fpn_lorac.yaml": ("Semantic FPN", "semantic_fpn"),
    "ade20k_semantic_fpn_lorac.yaml": ("Semantic FPN", "semantic_fpn"),
    "cityscapes_deeplab_lorac.yaml": ("DeepLabV3+", "deeplab_v3_plus"),
    "voc_deeplab_lorac.yaml": ("DeepLabV3+", "deeplab_v3_plus"),
}


@pytest.mark.parametrize("config", list(PROTOCOLS))
def test_shipped_config_trains_and_reports_miou(config, runs):
    _, out = runs(config)
    metrics = _sem_seg_metrics(out, PROTOCOLS[config][3])
    for name in ("mIoU", "fwIoU", "mACC", "pACC"):
        assert isinstance(metrics[name], float) and math.isfinite(metrics[name]), (name, metrics)
    # the converted file filled the whole ResNet: detectron2 lists only the new layers (FPN,
    # head) among the model's weights that the file did not have, none of the ResNet's
    log = (out / "log.txt").read_text()
    missing = log.split("not found in the checkpoint:")[1].split("\n[")[0]
    assert "sem_seg_head" in missing
    assert not any(f"{p}{s}" in missing for p in ("backbone.", "bottom_up.") for s in RESNET)
    with open(out / "metrics.json") as f:
        trained = [json.loads(line) for line in f]
    assert max(r["iteration"] for r in trained if "total_loss" in r) == 1  # iterations 0, 1
    # the collector files it in a semantic table of its own, with the semantic columns
    run = read_run(str(out))
    head, detector = HEADS[config]
    assert (run.kind, run.detector) == ("sem_seg", detector)
    md, _ = write_table([run], str(out.parent / "table"))
    text = Path(md).read_text()
    test_set = PROTOCOLS[config][3]
    assert text.startswith(f"### semantic segmentation, {test_set}, {head} R50, 2 iterations")
    assert "| pretraining | mIoU | fwIoU | mACC | pACC |" in text


def test_eval_only_reproduces_a_deeplab_run(runs, tmp_path):
    """--eval-only loads a DeepLab run's model_final.pth (its own names, every weight checked)
    into a new OUTPUT_DIR and gives the run's mIoU again."""
    config = "voc_deeplab_lorac.yaml"
    datasets, out = runs(config)
    again = tmp_path / "eval"
    result = _train_net(
        config, datasets, again, "--eval-only", "MODEL.WEIGHTS", str(out / "model_final.pth"),
        *PROTOCOLS[config][2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    test_set = PROTOCOLS[config][3]
    assert _sem_seg_metrics(again, test_set)["mIoU"] == pytest.approx(
        _sem_seg_metrics(out, test_set)["mIoU"], abs=1e-6
    )


def test_voc12_aug_missing_split_file_is_one_error_line(tmp_path):
    """A VOC2012 folder without train_aug.txt: one error line naming the file and the variable,
    nothing written."""
    write_voc12_aug(tmp_path / "datasets", {"val": 1})
    out = tmp_path / "run"
    result = _train_net("voc_deeplab_lorac.yaml", tmp_path / "datasets", out)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: "), result.stderr
    split = tmp_path / "datasets" / "VOC2012" / "ImageSets" / "Segmentation" / "train_aug.txt"
    assert f"split file {split} does not exist" in lines[-1]
    assert "DETECTRON2_DATASETS" in lines[-1]
    assert not out.exists()
