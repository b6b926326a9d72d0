"""Every detection protocol's shipped config, trained 2 iterations on a tiny dataset in the
dataset's real layout under ``$DETECTRON2_DATASETS`` (read by detectron2's own registration, see
``real_layouts.py``), and evaluated by the evaluator its test set's ``evaluator_type`` names:
``results.json`` holds that protocol's finite numbers.

The configs are changed only in size: images (shorter side 64), batch, ROI sampling, proposals
and detections per image (mask post-processing of LVIS's 300 detections over 1203 classes takes
20 s an image on a CPU), iterations, no precise-BN (``TEST.PRECISE_BN.ENABLED False``), the CPU
and a converted random ResNet-50. One more override, ``MODEL.ROI_HEADS.SCORE_THRESH_TEST 0``:
after 2 iterations no class score clears detectron2's 0.05, and an evaluation without
detections has no AP to report (COCO's evaluator returns NaN).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers import ROOT
from tests.transfer.detection.real_layouts import (
    builtin_datasets_under,
    write_cityscapes,
    write_coco,
    write_lvis,
    write_voc,
)
from transfer.detection.convert import convert_checkpoint
from transfer.detection.results import read_run, write_table
from transfer.detection.trainer import build_argument_parser, run

pytestmark = pytest.mark.protocols  # make test-protocols

TINY = [
    "MODEL.DEVICE", "cpu",
    "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
    "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "96",
    "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "2",
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE", "32", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "16",
    "MODEL.RPN.POST_NMS_TOPK_TRAIN", "32", "MODEL.RPN.POST_NMS_TOPK_TEST", "16",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "TEST.DETECTIONS_PER_IMAGE", "10",
    "TEST.PRECISE_BN.ENABLED", "False", "DATALOADER.NUM_WORKERS", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory) -> Path:
    """One ``$DETECTRON2_DATASETS`` holding VOC, COCO, LVIS and Cityscapes."""
    root = tmp_path_factory.mktemp("detectron2_datasets")
    write_voc(root)
    write_coco(root)
    write_lvis(root)
    write_cityscapes(root)
    return root


@pytest.fixture(scope="module")
def r50_weights(tmp_path_factory) -> str:
    """A random torchvision ResNet-50 converted once: the file every config loads."""
    d = tmp_path_factory.mktemp("r50")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet50().state_dict(), d / "r50.pth")
    convert_checkpoint(str(d / "r50.pth"), str(d / "lorac.pkl"))
    return str(d / "lorac.pkl")


def train_shipped(config: str, root: Path, weights: str, output_dir: Path, *extra: str) -> dict:
    """``tools/train_net.py``'s run of the shipped ``config`` at tiny sizes (and the ``extra``
    overrides) with the builtin datasets under ``root``; returns ``results.json``'s results."""
    argv = ["--config-file", str(ROOT / "configs" / config), *TINY, *extra]
    argv += ["MODEL.WEIGHTS", weights, "OUTPUT_DIR", str(output_dir)]
    with builtin_datasets_under(root):
        run(build_argument_parser().parse_args(argv))
    return json.loads((output_dir / "results.json").read_text())["results"]


def assert_finite(results: dict, dataset: str, expected: dict[str, tuple[str, ...]]) -> None:
    assert sorted(results) == [dataset]
    assert sorted(results[dataset]) == sorted(expected)
    for task, metrics in expected.items():
        for metric in metrics:
            value = results[dataset][task][metric]
            assert isinstance(value, float) and math.isfinite(value), (task, metric, value)


def test_voc07_12_faster_rcnn_c4_reports_voc_ap(datasets_root, r50_weights, tmp_path):
    """VOC07+12 trainval -> VOC07 test with the C4 model: Pascal VOC's evaluator."""
    out = tmp_path / "run"
    results = train_shipped("voc_faster_rcnn_c4_lorac.yaml", datasets_root, r50_weights, out)
    assert_finite(results, "voc_2007_test", {"bbox": ("AP", "AP50", "AP75")})
    # the collector files the run under its protocol with VOC's columns
    md, _ = write_table([read_run(str(out))], str(tmp_path / "table"))
    text = Path(md).read_text()
    assert text.startswith("### Pascal VOC, R50-C4, 2 iterations of 2\n")
    assert "| pretraining | box AP50 | box AP | box AP75 |" in text and "| lorac |" in text


COCO_TASKS = {
    "coco_mask_rcnn_c4_lorac.yaml": ("bbox", "segm"),
    "coco_mask_rcnn_c4_2x_lorac.yaml": ("bbox", "segm"),
    "coco_faster_rcnn_2x_lorac.yaml": ("bbox",),
    "coco_mask_rcnn_2x_lorac.yaml": ("bbox", "segm"),
    "coco_keypoint_rcnn_2x_lorac.yaml": ("bbox", "keypoints"),
}


@pytest.mark.parametrize("config", list(COCO_TASKS))
def test_coco_c4_and_2x_configs_report_coco_ap(config, datasets_root, r50_weights, tmp_path):
    results = train_shipped(config, datasets_root, r50_weights, tmp_path)
    dataset = "keypoints_coco_2017_val" if "keypoint" in config else "coco_2017_val"
    assert_finite(results, dataset, dict.fromkeys(COCO_TASKS[config], ("AP", "AP50", "AP75")))


def test_lvis_v1_mask_rcnn_reports_lvis_ap_by_frequency(datasets_root, r50_weights, tmp_path):
    results = train_shipped("lvis_mask_rcnn_lorac.yaml", datasets_root, r50_weights, tmp_path)
    metrics = ("AP", "AP50", "AP75", "APr", "APc", "APf")
    assert_finite(results, "lvis_v1_val", {"bbox": metrics, "segm": metrics})


def test_cityscapes_mask_rcnn_reports_cityscapes_ap(
    datasets_root, r50_weights, tmp_path, monkeypatch
):
    """Cityscapes fine instances (polygons read with shapely, a dependency of the set-up):
    cityscapesScripts' AP and AP50, its matches.json kept in the run's inference folder, not
    in the directory the tool was started from."""
    started_in = tmp_path / "cwd"
    started_in.mkdir()
    monkeypatch.chdir(started_in)
    out = tmp_path / "run"
    results = train_shipped("cityscapes_mask_rcnn_lorac.yaml", datasets_root, r50_weights, out)
    assert_finite(results, "cityscapes_fine_instance_seg_val", {"segm": ("AP", "AP50")})
    assert (out / "inference" / "cityscapes_fine_instance_seg_val" / "matches.json").is_file()
    assert list(started_in.iterdir()) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("config", "dataset", "task"),
    [
        ("voc_faster_rcnn_c4_lorac.yaml", "voc_2007_test", "bbox"),
        ("coco_mask_rcnn_c4_lorac.yaml", "coco_2017_val", "segm"),
        ("lvis_mask_rcnn_lorac.yaml", "lvis_v1_val", "segm"),
    ],
)
def test_amp_trains_the_c4_and_fpn_configs_on_a_gpu(
    config, dataset, task, datasets_root, r50_weights, tmp_path
):
    """SOLVER.AMP.ENABLED on a GPU: detectron2's AMPTrainer (float16 autocast, grad scaler)
    runs the shipped configs, C4 and FPN, to finite numbers."""
    amp = ("MODEL.DEVICE", "cuda", "SOLVER.AMP.ENABLED", "True")
    results = train_shipped(config, datasets_root, r50_weights, tmp_path, *amp)
    assert math.isfinite(results[dataset][task]["AP"])
    run_config = json.loads((tmp_path / "results.json").read_text())["config"]
    assert run_config["SOLVER"]["AMP"]["ENABLED"] is True  # kept on a GPU: AMPTrainer ran
