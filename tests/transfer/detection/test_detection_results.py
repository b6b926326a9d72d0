"""The Table 4 collector: results.json and metrics.json runs, grouping, errors, and its CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from transfer.detection.results import (
    ResultsError,
    build_table,
    read_run,
    write_results,
    write_table,
)

REPO = ROOT


def _cfg(weights: str, mask: bool = False, keypoint: bool = False) -> dict:
    return {
        "MODEL": {"WEIGHTS": weights, "MASK_ON": mask, "KEYPOINT_ON": keypoint},
        "SOLVER": {"MAX_ITER": 90000},
    }


def _metrics(base: float) -> dict:
    return {"AP": base, "AP50": base + 20, "AP75": base + 2, "APs": float("nan")}


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """Faster/Mask/Keypoint runs for lorac and a Mask R-CNN run for random init."""
    specs = [
        ("lorac_faster", _cfg("pretrained/lorac.pkl"), {"bbox": _metrics(39.5)}),
        (
            "lorac_mask",
            _cfg("pretrained/lorac.pkl", mask=True),
            {"bbox": _metrics(40.0), "segm": _metrics(37.1)},
        ),
        (
            "lorac_kp",
            _cfg("pretrained/lorac.pkl", keypoint=True),
            {"bbox": _metrics(55.0), "keypoints": _metrics(66.6)},
        ),
        ("random_mask", _cfg("", mask=True), {"bbox": _metrics(30.1), "segm": _metrics(28.5)}),
    ]
    dirs = []
    for name, cfg, results in specs:
        write_results(str(tmp_path / name), cfg, results, ["coco_2017_val"])
        dirs.append(tmp_path / name)
    return dirs


def test_table_has_table4_shape(runs, tmp_path):
    md, csv_path = write_table([read_run(str(d)) for d in runs], str(tmp_path / "out" / "t4"))
    rows = Path(csv_path).read_text().splitlines()
    assert rows[0].split(",")[:4] == [
        "pretraining",
        "Faster R-CNN box AP",
        "Faster R-CNN box AP50",
        "Faster R-CNN box AP75",
    ]
    assert len(rows[0].split(",")) == 10
    assert rows[1] == "lorac,39.500,59.500,41.500,37.100,57.100,39.100,66.600,86.600,68.600"
    assert rows[2] == "random,,,,28.500,48.500,30.500,,,"
    text = Path(md).read_text()
    assert "| lorac | 39.5 | 59.5 | 41.5 | 37.1 |" in text
    assert "| random | – | – | – | 28.5 |" in text


def test_metrics_json_fallback_uses_the_last_evaluation(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_cfg("w/supervised.pkl", mask=True)))
    lines = [
        {"iteration": 10, "total_loss": 1.0},
        {"iteration": 19, "bbox/AP": 1.0, "segm/AP": 2.0, "segm/AP50": 3.0, "segm/AP75": 4.0},
        {"iteration": 29, "bbox/AP": 5.0, "segm/AP": 6.0, "segm/AP50": 7.0, "segm/AP75": 8.0},
    ]
    (run / "metrics.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = read_run(str(run))
    assert (result.pretraining, result.detector) == ("supervised", "mask_rcnn")
    assert result.metrics["segm"] == {"AP": 6.0, "AP50": 7.0, "AP75": 8.0}


def test_two_runs_in_one_cell_is_an_error_unless_labelled(runs):
    first, again = read_run(str(runs[0])), read_run(str(runs[0]))
    with pytest.raises(ResultsError, match="two faster_rcnn runs for 'lorac'"):
        write_table([first, again], "/nonexistent/never")
    assert read_run(str(runs[0]), label="lorac-2").pretraining == "lorac-2"


def test_unreadable_run_dir_is_named(tmp_path):
    with pytest.raises(ResultsError, match=str(tmp_path)):
        read_run(str(tmp_path))


def test_cli_writes_both_tables(runs, tmp_path):
    prefix = tmp_path / "table"
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "collect_detection_results.py")]
        + [f"mine={runs[0]}", *map(str, runs[1:]), "--out", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "| mine | 39.5 |" in result.stdout and "| lorac | – |" in result.stdout
    assert (tmp_path / "table.md").is_file() and (tmp_path / "table.csv").is_file()
    bad = subprocess.run(
        [sys.executable, str(REPO / "tools" / "collect_detection_results.py")]
        + [str(tmp_path / "nope"), "--out", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    )


def _detection_run(root: Path, name: str, weights: str, mask: bool = False) -> str:
    metrics = {"bbox": _metrics(40.0)} | ({"segm": _metrics(35.0)} if mask else {})
    write_results(str(root / name), _cfg(weights, mask=mask), metrics, ["coco_2017_val"])
    return str(root / name)


def test_rows_are_named_after_the_weights_run_and_keyed_by_them(tmp_path):
    """Proves: detection runs from two pretraining runs' model_final.pkl leave two rows named
    after those runs (not one "model_final" row mixing both models' columns), also for a
    results.json written before rows were named so; runs from different weights under one
    label are refused, naming both runs, until labelled apart."""
    for run in ("lorac_run", "mocom_run", "other/lorac_run"):
        (tmp_path / "pre" / run).mkdir(parents=True)
        (tmp_path / "pre" / run / "model_final.pkl").write_bytes(run.encode())
    lorac, mocom, namesake = (
        str(tmp_path / "pre" / r / "model_final.pkl")
        for r in ("lorac_run", "mocom_run", "other/lorac_run")
    )
    faster = _detection_run(tmp_path, "faster", lorac)
    mask = _detection_run(tmp_path, "mask", mocom, mask=True)
    labels, values = build_table([read_run(faster), read_run(mask)])
    assert labels == ["lorac_run", "mocom_run"]
    assert values[0][:4] == [40.0, 60.0, 42.0, None] and values[1][3] == 35.0
    results = json.loads((tmp_path / "mask" / "results.json").read_text())
    assert len(results["weights_sha256"]) == 64
    del results["weights_sha256"]
    results["pretraining"] = "model_final"  # as written before
    (tmp_path / "mask" / "results.json").write_text(json.dumps(results))
    assert build_table([read_run(faster), read_run(mask)])[0] == labels

    other = _detection_run(tmp_path, "other_mask", namesake, mask=True)
    with pytest.raises(ResultsError, match=r"both labelled 'lorac_run' but started from diff"):
        build_table([read_run(faster), read_run(other)])
    assert build_table([read_run(faster), read_run(other, label="seed 2")])[0] == [
        "lorac_run",
        "seed 2",
    ]


def test_the_same_weights_under_two_paths_are_one_row(tmp_path):
    """Proves runs recording the same weights file hash share a row although their
    MODEL.WEIGHTS differ (a relative and an absolute path); without recorded hashes the path
    decides."""
    (tmp_path / "pre").mkdir()
    (tmp_path / "pre" / "lorac.pkl").write_bytes(b"weights")
    faster = _detection_run(tmp_path, "faster", str(tmp_path / "pre" / "lorac.pkl"))
    link = tmp_path / "link.pkl"
    link.symlink_to(tmp_path / "pre" / "lorac.pkl")
    mask = _detection_run(tmp_path, "mask", str(link), mask=True)
    first, second = read_run(faster, label="lorac"), read_run(mask, label="lorac")
    assert build_table([first, second])[0] == ["lorac"]
    second.weights_sha256 = ""
    with pytest.raises(ResultsError, match="different weights"):
        build_table([first, second])


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} is not standard JSON")


def _shipped_run(root: Path, config: str, results: dict, dataset: str, kind: str) -> str:
    """A results.json as tools/train_net.py writes it for the shipped ``config``."""
    from transfer.detection.config import load_config

    cfg = yaml.safe_load(load_config(str(REPO / "configs" / config)).dump())
    write_results(str(root / config), cfg, results, [dataset], evaluator_type=kind)
    return str(root / config)


def test_one_table_per_protocol_with_its_columns_and_the_published_references(tmp_path):
    """Runs of the VOC, COCO C4 2x, LVIS, Cityscapes and semantic protocols each land in their
    own table with that protocol's columns, and the published rows (with sources) sit below
    the runs of the protocols that have them."""
    voc = {"bbox": {"AP": 50.0, "AP50": 80.0, "AP75": 55.0}}
    coco = {"bbox": _metrics(41.0), "segm": _metrics(36.0)}
    lvis_task = {"AP": 20.0, "AP50": 33.0, "AP75": 21.0, "APr": 9.0, "APc": 19.0, "APf": 26.0}
    lvis = {"bbox": dict(lvis_task), "segm": dict(lvis_task)}
    runs = [
        _shipped_run(tmp_path, "voc_faster_rcnn_c4_lorac.yaml", voc, "voc_2007_test", "pascal_voc"),
        _shipped_run(tmp_path, "coco_mask_rcnn_c4_2x_lorac.yaml", coco, "coco_2017_val", "coco"),
        _shipped_run(tmp_path, "lvis_mask_rcnn_lorac.yaml", lvis, "lvis_v1_val", "lvis"),
        _shipped_run(
            tmp_path,
            "cityscapes_mask_rcnn_lorac.yaml",
            {"segm": {"AP": 30.0, "AP50": 58.0}},
            "cityscapes_fine_instance_seg_val",
            "cityscapes_instance",
        ),
    ]
    sem = tmp_path / "sem"
    sem_metrics = {"mIoU": 74.0, "fwIoU": 88.0, "mACC": 81.0, "pACC": 94.0}
    write_results(
        str(sem),
        {"MODEL": {"WEIGHTS": "pretrained/lorac.pkl", "META_ARCHITECTURE": "SemanticSegmentor",
                   "SEM_SEG_HEAD": {"NAME": "DeepLabV3PlusHead"}},
         "SOLVER": {"MAX_ITER": 90000, "IMS_PER_BATCH": 8}},
        {"sem_seg": {**sem_metrics, "IoU-road": 97.0, "IoU-train": float("nan")}},
        ["cityscapes_fine_sem_seg_val"],
        evaluator_type="cityscapes_sem_seg",
    )  # fmt: skip
    # a class absent from the test set (SemSegEvaluator's NaN) is null: the file is strict JSON
    strict = json.loads((sem / "results.json").read_text(), parse_constant=_refuse_constant)
    assert strict["results"]["cityscapes_fine_sem_seg_val"]["sem_seg"]["IoU-train"] is None
    assert strict["detector"] == "deeplab_v3_plus"
    runs.append(str(sem))
    md, first_csv = write_table([read_run(r) for r in runs], str(tmp_path / "out" / "t"))
    text = Path(md).read_text()
    sections = {s.split("\n", 1)[0]: s for s in text.split("### ")[1:]}
    assert list(sections) == [
        "Pascal VOC, R50-C4, 24k iterations of 16",
        "COCO, R50-C4, 2x",
        "LVIS, R50-FPN, 1x",
        "Cityscapes instance segmentation, R50-FPN, 24k iterations of 8",
        "semantic segmentation, cityscapes_fine_sem_seg_val, DeepLabV3+ R50, 90k iterations of 8",
    ]
    voc_md = sections["Pascal VOC, R50-C4, 24k iterations of 16"]
    assert "| pretraining | box AP50 | box AP | box AP75 | source |" in voc_md
    assert "| lorac | 80.0 | 50.0 | 55.0 |" in voc_md
    assert "| MoCo v2 800ep (published) | 82.5 | 57.4 | 64.0 | MoCo, detection/README.md" in voc_md
    coco_md = sections["COCO, R50-C4, 2x"]
    assert "Faster R-CNN" not in coco_md and "Keypoint" not in coco_md  # no run, no reference
    assert "| supervised IN-1M (published) | 40.0 | 59.9 | 43.1 | 34.7 | 56.5 | 36.9 |" in coco_md
    lvis_md = sections["LVIS, R50-FPN, 1x"]
    assert "| box AP | mask AP | mask APr | mask APc | mask APf |" in lvis_md
    assert "| lorac | 20.0 | 20.0 | 9.0 | 19.0 | 26.0 |" in lvis_md and "published" not in lvis_md
    city = sections["Cityscapes instance segmentation, R50-FPN, 24k iterations of 8"]
    assert "| lorac | 30.0 | 58.0 |" in city and "| MoCo v1 IN-1M (published) | – | 59.3 |" in city
    sem_md = sections[
        "semantic segmentation, cityscapes_fine_sem_seg_val, DeepLabV3+ R50, 90k iterations of 8"
    ]
    assert "| pretraining | mIoU | fwIoU | mACC | pACC |" in sem_md
    assert "| lorac | 74.0 | 88.0 | 81.0 | 94.0 |" in sem_md and "published" not in sem_md
    csvs = sorted(p.name for p in (tmp_path / "out").glob("t_*.csv"))
    assert len(csvs) == 5 and first_csv.endswith("t_pascal_voc_r50_c4_24k_iterations_of_16.csv")
    header = Path(first_csv).read_text().splitlines()[0]
    assert header == "pretraining,box AP50,box AP,box AP75,source"
