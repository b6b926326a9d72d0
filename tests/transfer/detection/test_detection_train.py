"""Instant fine-tuning runs of the three LORAC configs on generated COCO-format data, and the
setup errors of tools/train_net.py.

The instant variants keep each config's detector (FPN with SyncBN, which one process runs as
plain BN) on a ResNet-18 body (``MODEL.RESNETS.DEPTH 18``: what is tested is the config, not the
body's size; the converter's tests keep the real R50) and shrink images, batch, ROI sampling and
iterations, as detectron2's quick_schedules do.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets.builtin_meta import COCO_PERSON_KEYPOINT_NAMES
from PIL import Image, ImageDraw

from tests.helpers import ROOT
from tests.helpers.mistakes import ToolResult, run_main, tool_main
from transfer.detection.config import DetectionSetupError, load_config
from transfer.detection.convert import convert_checkpoint
from transfer.detection.datasets import check_datasets, register_coco_dataset
from transfer.detection.results import read_run, write_table
from transfer.detection.trainer import build_argument_parser, load_checked_config, run

REPO = ROOT
CONFIGS = {
    "faster_rcnn": "coco_faster_rcnn_lorac.yaml",
    "mask_rcnn": "coco_mask_rcnn_lorac.yaml",
    "keypoint_rcnn": "coco_keypoint_rcnn_lorac.yaml",
}
TASKS = {
    "faster_rcnn": ["bbox"],
    "mask_rcnn": ["bbox", "segm"],
    "keypoint_rcnn": ["bbox", "keypoints"],
}
W, H = 96, 72


def _shape_annotation(ann_id, image_id, category_id, box, polygon, keypoints=None) -> dict:
    x0, y0, x1, y1 = box
    ann = {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [x0, y0, x1 - x0, y1 - y0],
        "area": float((x1 - x0) * (y1 - y0)),
        "iscrowd": 0,
        "segmentation": [[float(c) for xy in polygon for c in xy]],
    }
    if keypoints is not None:
        ann["keypoints"] = [float(v) for kp in keypoints for v in (*kp, 2)]
        ann["num_keypoints"] = len(keypoints)
    return ann


def make_coco(root: Path, num_images: int = 4, people: bool = False) -> tuple[str, str]:
    """Images with drawn squares and triangles (or 'people' boxes with 17 keypoints)."""
    rng = np.random.default_rng(1 if people else 0)
    images_dir = root / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for image_id in range(1, num_images + 1):
        img = Image.new("RGB", (W, H), tuple(int(c) for c in rng.integers(0, 80, 3)))
        draw = ImageDraw.Draw(img)
        for k in range(2):
            w, h = (int(s) for s in rng.integers(22, 34, 2))
            x0, y0 = int(rng.integers(0, W - w)), int(rng.integers(0, H - h))
            x1, y1 = x0 + w, y0 + h
            category = 1 if people else 1 + k % 2
            if category == 1:
                polygon = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
            else:
                polygon = [(x0, y1), ((x0 + x1) / 2, y0), (x1, y1)]
            draw.polygon(polygon, fill=(200, 60 + 120 * k, 40))
            keypoints = None
            if people:
                kx = rng.uniform(x0 + 1, x1 - 1, 17)
                ky = np.sort(rng.uniform(y0 + 1, y1 - 1, 17))  # head at the top
                keypoints = [(float(a), float(b)) for a, b in zip(kx, ky, strict=True)]
            anns.append(
                _shape_annotation(
                    len(anns) + 1, image_id, category, (x0, y0, x1, y1), polygon, keypoints
                )
            )
        name = f"{image_id:03d}.jpg"
        img.save(images_dir / name, quality=95)
        images.append({"id": image_id, "file_name": name, "width": W, "height": H})
    if people:
        categories = [
            {
                "id": 1,
                "name": "person",
                "keypoints": list(COCO_PERSON_KEYPOINT_NAMES),
                "skeleton": [],
            }
        ]
    else:
        categories = [{"id": 1, "name": "square"}, {"id": 2, "name": "triangle"}]
    json_file = root / "annotations.json"
    json_file.write_text(
        json.dumps({"images": images, "annotations": anns, "categories": categories})
    )
    return str(json_file), str(images_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Iterator[dict[str, tuple[str, str]]]:
    root = tmp_path_factory.mktemp("coco")
    yield {
        "shapes": make_coco(root / "shapes"),
        "people": make_coco(root / "people", people=True),
    }
    # the in-process runs registered these names over this module's files: free them for the
    # next module in this process (registering a name over other files is an error)
    for name in ("instant_shapes", "instant_people"):
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """A converted random-weight torchvision ResNet-18 backbone."""
    d = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), d / "resnet18.pth")
    convert_checkpoint(str(d / "resnet18.pth"), str(d / "resnet18.pkl"))
    return str(d / "resnet18.pkl")


def instant_args(detector, data, weights_file, output_dir, *extra, depth=None):
    """The parsed command line of an instant run; ``depth``: a MODEL.RESNETS.DEPTH override."""
    name = "people" if detector == "keypoint_rcnn" else "shapes"
    json_file, image_root = data[name]
    argv = ["--config-file", str(REPO / "configs" / CONFIGS[detector])]
    argv += ["--register-coco", f"instant_{name}", json_file, image_root, *extra]
    argv += [
        "MODEL.DEVICE", "cpu",
        "MODEL.WEIGHTS", weights_file,
        "DATASETS.TRAIN", f"('instant_{name}',)",
        "DATASETS.TEST", f"('instant_{name}',)",
        "MODEL.ROI_HEADS.NUM_CLASSES", "1" if name == "people" else "2",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
        "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "96",
        "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "3", "SOLVER.STEPS", "(2,)",
        "SOLVER.BASE_LR", "0.001", "SOLVER.WARMUP_ITERS", "1",
        "MODEL.RPN.BATCH_SIZE_PER_IMAGE", "32", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32",
        "MODEL.RPN.POST_NMS_TOPK_TRAIN", "100", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
        "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0",  # an untrained head must still predict
        "TEST.DETECTIONS_PER_IMAGE", "10",  # keypoint/mask post-processing is slow on CPU
        "TEST.PRECISE_BN.NUM_ITER", "2",
        "DATALOADER.NUM_WORKERS", "0",
        "OUTPUT_DIR", str(output_dir),
    ]  # fmt: skip
    if depth is not None:
        argv += ["MODEL.RESNETS.DEPTH", str(depth)]
    return build_argument_parser().parse_args(argv)


@pytest.fixture(scope="module")
def runs(data, weights, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    out = {}
    for detector in CONFIGS:
        output_dir = tmp_path_factory.mktemp(detector)
        out[detector] = (
            output_dir,
            run(instant_args(detector, data, weights, output_dir, depth=18)),
        )
    return out


@pytest.mark.parametrize("detector", list(CONFIGS))
def test_instant_run_trains_and_reports_coco_ap(detector, runs):
    """Each LORAC config trains a few iterations and reports finite COCO AP/AP50/AP75."""
    output_dir, results = runs[detector]
    name = "instant_people" if detector == "keypoint_rcnn" else "instant_shapes"
    assert sorted(results) == [name]
    assert sorted(results[name]) == sorted(TASKS[detector])
    for task in TASKS[detector]:
        for metric in ("AP", "AP50", "AP75"):
            value = results[name][task][metric]
            assert isinstance(value, float) and math.isfinite(value), (task, metric, value)
    assert (output_dir / "model_final.pth").is_file()
    # full config and environment, dumped by pretrain.utils.run_setup.setup_run
    assert (output_dir / "config.yaml").is_file() and (output_dir / "env.txt").is_file()
    with open(output_dir / "metrics.json") as f:
        records = [json.loads(line) for line in f]
    trained = [r["iteration"] for r in records if "total_loss" in r]
    assert trained and max(trained) == 2  # SOLVER.MAX_ITER 3: iterations 0, 1, 2


def test_results_table_from_instant_runs(runs, tmp_path):
    """The collector turns the three runs into one Table 4 row with all nine numbers."""
    md, csv_path = write_table([read_run(str(d)) for d, _ in runs.values()], str(tmp_path / "t4"))
    rows = Path(csv_path).read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("resnet18,")
    assert all(cell != "" for cell in rows[1].split(",")), rows[1]
    assert "resnet18" in Path(md).read_text()


def test_eval_only_reloads_the_trained_model(runs, data, tmp_path):
    """--eval-only loads model_final.pth strictly and reproduces the final evaluation (into its
    own OUTPUT_DIR: the finished run's is kept as it is)."""
    output_dir, results = runs["faster_rcnn"]
    weights = str(output_dir / "model_final.pth")
    args = instant_args("faster_rcnn", data, weights, tmp_path, depth=18)
    args.eval_only = True
    again = run(args)
    assert again["instant_shapes"]["bbox"]["AP"] == pytest.approx(
        results["instant_shapes"]["bbox"]["AP"], abs=1e-6
    )


def test_weights_that_do_not_fit_are_named(data, weights, tmp_path):
    """R18 weights into the R50 config stop before training, naming the mismatching keys."""
    args = instant_args("faster_rcnn", data, weights, tmp_path)
    with pytest.raises(DetectionSetupError) as e:
        run(args)
    msg = str(e.value)
    assert weights in msg
    assert "backbone.bottom_up.res2.0.conv1.weight (64, 64, 3, 3) vs model (64, 64, 1, 1)" in msg
    assert "e.g. backbone.bottom_up.res2.0.conv3.norm.bias" in msg
    assert not (tmp_path / "model_final.pth").exists()


def test_missing_dataset_files_are_named(data, tmp_path):
    json_file, image_root = data["shapes"]
    missing_json = str(tmp_path / "nope.json")
    with pytest.raises(DetectionSetupError, match=f"annotation file {missing_json} does not"):
        register_coco_dataset("missing_json", missing_json, image_root)
    with pytest.raises(DetectionSetupError, match=f"image folder {tmp_path}/imgs does not"):
        register_coco_dataset("missing_root", json_file, str(tmp_path / "imgs"))


def test_num_classes_must_match_the_dataset(data):
    register_coco_dataset("instant_shapes_check", *data["shapes"])
    cfg = load_config(str(REPO / "configs" / CONFIGS["mask_rcnn"]))
    cfg.DATASETS.TRAIN = cfg.DATASETS.TEST = ("instant_shapes_check",)
    with pytest.raises(DetectionSetupError, match="NUM_CLASSES is 80; add MODEL.ROI_HEADS.NUM_"):
        check_datasets(cfg)
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 2
    check_datasets(cfg)


def test_an_evaluation_checks_the_test_sets_alone(data, tmp_path):
    """``--eval-only`` reads DATASETS.TEST only: a training set whose files are not on this
    machine (COCO's train2017 never downloaded) stops training before it starts, and not an
    evaluation."""
    register_coco_dataset("instant_shapes_eval", *data["shapes"])
    DatasetCatalog.register("instant_absent_train", list)
    MetadataCatalog.get("instant_absent_train").set(
        json_file=str(tmp_path / "train.json"), image_root=str(tmp_path / "train")
    )
    argv = ["--config-file", str(REPO / "configs" / CONFIGS["mask_rcnn"]), "MODEL.DEVICE", "cpu",
            "DATASETS.TRAIN", "('instant_absent_train',)", "DATASETS.TEST",
            "('instant_shapes_eval',)", "MODEL.ROI_HEADS.NUM_CLASSES", "2"]  # fmt: skip
    try:
        parser = build_argument_parser()
        with pytest.raises(DetectionSetupError, match="instant_absent_train: annotation file"):
            load_checked_config(parser.parse_args(argv))
        cfg, _ = load_checked_config(parser.parse_args(["--eval-only", *argv]))
        assert cfg.DATASETS.TEST == ("instant_shapes_eval",)
    finally:
        for name in ("instant_shapes_eval", "instant_absent_train"):
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)


def _train_net(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "train_net.py"), *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def _one_error_line(result: subprocess.CompletedProcess | ToolResult) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: "), result.stderr
    return lines[-1]


def test_cli_unknown_config_key_names_key_and_file(tmp_path):
    """A misspelt key in a config file: one error line naming the key and the file (the tool's
    ``main``, run in this process)."""
    config = tmp_path / "typo.yaml"
    base = REPO / "configs" / "Base-RCNN-FPN-SyncBN.yaml"
    config.write_text(f'_BASE_: "{base}"\nMODEL:\n  RESNETS:\n    DEPTHH: 50\n')
    line = _one_error_line(
        run_main(tool_main("tools/train_net.py"), ["--config-file", str(config)])
    )
    assert str(config) in line and "MODEL.RESNETS.DEPTHH" in line
    # (unknown command-line keys: tests/transfer/detection/test_detection_configs.py, without a
    # subprocess)


def test_cli_finds_coco_through_detectron2_datasets(tmp_path):
    """Builtin COCO 2017 is looked up under $DETECTRON2_DATASETS; a missing file is named (a
    process: detectron2 reads the variable when it is imported)."""
    config = str(REPO / "configs" / CONFIGS["keypoint_rcnn"])
    result = _train_net(
        "--config-file", config, "MODEL.DEVICE", "cpu", env={"DETECTRON2_DATASETS": str(tmp_path)}
    )
    line = _one_error_line(result)
    assert f"{tmp_path}/coco/annotations/person_keypoints_train2017.json" in line
    assert "DETECTRON2_DATASETS" in line


@pytest.mark.processes  # make test-processes
def test_cli_two_cpu_processes_use_naive_syncbn(data, weights, tmp_path):
    """--num-gpus 2 on CPU: SyncBN becomes naiveSyncBN, DDP runs, results are written."""
    json_file, image_root = data["shapes"]
    args = instant_args("faster_rcnn", data, weights, tmp_path, depth=18)
    opts = list(args.opts)
    opts[opts.index("SOLVER.MAX_ITER") + 1] = "2"
    opts[opts.index("SOLVER.STEPS") + 1] = "(1,)"
    result = _train_net(
        "--config-file", args.config_file, "--num-gpus", "2", "--dist-url", "auto",
        "--register-coco", "instant_shapes", json_file, image_root, *opts,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "log.txt").read_text()
    assert "so naiveSyncBN for MODEL.FPN.NORM, MODEL.RESNETS.NORM" in log
    assert "World size: 2" in log
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert math.isfinite(results["instant_shapes"]["bbox"]["AP"])
