"""The Table 4 collector: results.json and metrics.json runs, grouping, errors, and its CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from transfer.detection.results import ResultsError, read_run, write_results, write_table

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
