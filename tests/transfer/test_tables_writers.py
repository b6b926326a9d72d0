"""Every writer of the results tables keeps apart figures of different data: the same model
evaluated on two data roots into one table dir is one ``error:`` line naming the flag that
separates them, or two rows, never one figure silently replacing the other (kNN, Table 2), and
the detection collector never merges two test sets into one row. Tiny generated data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.classification import make_imagenet, single_thread  # noqa: F401
from tests.helpers.mistakes import assert_user_error, run_main, snapshot
from transfer.cli import collect_detection_results, knn_eval
from transfer.detection.results import ResultsError, build_table, read_run, write_results
from transfer.tables import SOURCES_COLUMN, RowClashError, RowOwner, read_csv


def test_knn_on_two_image_folders_into_one_table_dir_keeps_both_figures(tmp_path):
    """The same weights on a second ImageFolder root: one error line naming --name, the table
    and the run dir untouched; with --name, a second row, and both figures are in the table."""
    a, b = make_imagenet(str(tmp_path / "a")), make_imagenet(str(tmp_path / "b"), 7, 3)
    tables = tmp_path / "tables"

    def argv(root: str, out: str, *extra: str) -> list[str]:
        return [
            "--random-init", "resnet18", "--dataset", "imagefolder", "--data-root", root,
            "--resize", "32", "--crop", "32", "--k", "3", "--num-workers", "0",
            "--device", "cpu", "--output-dir", str(tmp_path / out), "--table-dir", str(tables),
            *extra,
        ]  # fmt: skip

    assert knn_eval.main(argv(a, "first")) == 0
    before = snapshot(tables, tmp_path / "second")
    result = run_main(knn_eval.main, argv(b, "second"))
    assert_user_error(result, before, tables, tmp_path / "second", match="computed on")
    assert "--name" in result.stderr and f"imagefolder {b}" in result.stderr
    assert knn_eval.main(argv(b, "third", "--name", "random-init resnet18 on b")) == 0
    rows = read_csv(str(tables / "knn.csv")).rows
    assert [r["Model"] for r in rows] == ["random-init resnet18", "random-init resnet18 on b"]
    assert [r["train/test"] for r in rows] == ["18/6", "21/9"]  # each its own data's figure
    sources = [json.loads(r[SOURCES_COLUMN])["imagefolder kNN top-1"] for r in rows]
    assert [s.split()[1] for s in sources] == [a, b]


def test_table2_of_another_dataset_root_is_refused(tmp_path):
    """Table 2: a dataset column filled from one root is not overwritten by the same model's
    run on another root (check_tables before any work, write_tables too); its details stay."""
    from transfer.classification.transfer import DatasetResult, check_tables, write_tables

    owner = RowOwner("run", "LORAC", "aaaa0000")
    dtd = DatasetResult("dtd", "DTD", "top1", "val", "cached_features", 3, 10, 5, 5, 1, 1)
    dtd.test_score = 0.5
    write_tables(str(tmp_path), owner, [dtd], sources={"DTD": "dtd /data/a/dtd"})
    before = snapshot(tmp_path)
    other = {"DTD": "dtd /data/b/dtd"}
    with pytest.raises(RowClashError, match="'DTD' 50.00 computed on dtd /data/a/dtd"):
        check_tables(str(tmp_path), owner, "cached_features", sources=other)
    with pytest.raises(RowClashError, match="this run's is computed on dtd /data/b/dtd"):
        write_tables(str(tmp_path), owner, [dtd], sources=other)
    assert snapshot(tmp_path) == before


def _detection_run(path: Path, results: dict, datasets: list[str]) -> str:
    cfg = {"MODEL": {"WEIGHTS": "w/lorac.pkl", "MASK_ON": True}, "SOLVER": {"MAX_ITER": 10}}
    write_results(str(path), cfg, results, datasets)
    return str(path)


def test_detection_runs_on_two_test_sets_are_never_one_row(tmp_path):
    """Two runs of one pretraining evaluated on different test sets: the collector refuses to
    merge them into one row (one error line naming LABEL=RUN_DIR, nothing written); labelled
    apart they are two rows. A metrics.json logging two test sets is read as two, not merged."""
    boxes = {"bbox": {"AP": 40.0, "AP50": 60.0, "AP75": 43.0}}
    masks = {**boxes, "segm": {"AP": 35.0, "AP50": 57.0, "AP75": 37.0}}
    faster = _detection_run(tmp_path / "faster", boxes, ["coco_2017_val"])
    mask = _detection_run(tmp_path / "mask", masks, ["voc_2007_test"])
    faster_cfg = json.loads((tmp_path / "faster" / "results.json").read_text())["config"]
    faster_cfg["MODEL"]["MASK_ON"] = False  # a Faster R-CNN run
    data = json.loads((tmp_path / "faster" / "results.json").read_text())
    data["config"], data["detector"] = faster_cfg, "faster_rcnn"
    (tmp_path / "faster" / "results.json").write_text(json.dumps(data))

    out = tmp_path / "table"
    before = snapshot(tmp_path / "table.md", tmp_path / "table.csv")
    result = run_main(collect_detection_results.main, [faster, mask, "--out", str(out)])
    assert_user_error(
        result, before, tmp_path / "table.md", tmp_path / "table.csv", match="different test sets"
    )
    assert "coco_2017_val and voc_2007_test" in result.stderr and "LABEL=RUN_DIR" in result.stderr
    labels, _ = build_table([read_run(faster), read_run(mask, label="lorac-voc")])
    assert labels == ["lorac", "lorac-voc"]

    run = tmp_path / "logged"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"MODEL": {"WEIGHTS": ""}}))
    (run / "metrics.json").write_text(
        json.dumps({"iteration": 9, "coco/bbox/AP": 1.0, "voc/bbox/AP": 2.0}) + "\n"
    )
    with pytest.raises(ResultsError, match=r"several datasets \['coco', 'voc'\]"):
        read_run(str(run))
    assert read_run(str(run), dataset="voc").metrics == {"bbox": {"AP": 2.0}}
