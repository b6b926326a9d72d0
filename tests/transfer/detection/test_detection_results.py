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
