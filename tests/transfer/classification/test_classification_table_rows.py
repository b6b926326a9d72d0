"""Results tables keyed by the model, not the checkpoint's file name: every tool that writes into a
shared table dir (linear probe, semi-supervised, kNN, transfer) names a row after the checkpoint's
run, records the method and a hash of the weights, and never lets another model's results
replace a row. Tiny pretraining runs (``model_final.pth`` + ``config.yaml``), instant configs."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch
import torchvision

from pretrain.config import get_cfg
from tests.helpers.checkpoints import CASES
from tests.helpers.classification import (  # noqa: F401
    QUICK,
    make_dtd,
    make_imagenet,
    make_knn_fashion_mnist,
    no_md5,
    single_thread,
)
from tests.helpers.mistakes import assert_user_error, run_tool, snapshot
from transfer.classification.transfer import check_tables, write_tables
from transfer.cli import knn_eval, linear_probe, semi_supervised, transfer_linear
from transfer.tables import METHOD_COLUMN, WEIGHTS_COLUMN, RowClashError, RowOwner


def pretraining_run(root: Path, name: str, seed: int, prior: str = "laplace") -> str:
    """``root/name``: a LORAC-layout ``model_final.pth`` of a seeded ResNet-18 and the
    ``config.yaml`` a pretraining run dumps; returns the checkpoint's path."""
    run = root / name
    run.mkdir(parents=True)
    torch.manual_seed(seed)
    net, other = torchvision.models.resnet18(), torchvision.models.resnet18()
    torch.save(CASES["lorac"][2](net, other), run / "model_final.pth")
    cfg = get_cfg()
    cfg.LOSS.PRIOR = prior
    (run / "config.yaml").write_text(cfg.dump())
    return str(run / "model_final.pth")


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def probe_argv(ckpt: str, data: str, out: Path, tables: Path, *extra: str) -> list[str]:
    return [
        "--config-file", os.path.join(QUICK, "linear_instant.yaml"), "--checkpoint", ckpt,
        "--data-root", data, "--output-dir", str(out), "--table-dir", str(tables),
        "--device", "cpu", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Two pretraining runs of different methods and weights, a third whose run directory has
    the first one's name, and an ImageFolder to probe them on."""
    root = tmp_path_factory.mktemp("models")
    return {
        "lorac": pretraining_run(root / "a", "lorac_run", 0),
        "mocom": pretraining_run(root / "b", "mocom_run", 1, prior="none"),
        "namesake": pretraining_run(root / "c", "lorac_run", 2),
        "data": make_imagenet(str(root / "imagenet")),
    }


def test_two_models_probed_into_one_table_dir_leave_two_rows(models, tmp_path):
    """Proves: two pretraining runs, both ending in model_final.pth, probed into one table dir
    leave two rows, each named after its run directory, with the method its config.yaml names
    and the hash of its weights (the one results.json records)."""
    tables = tmp_path / "tables"
    for key in ("lorac", "mocom"):
        linear_probe.main(probe_argv(models[key], models["data"], tmp_path / key, tables))
    table = rows(tables / "table1_linear.csv")
    assert [r["Method"] for r in table] == ["lorac_run", "mocom_run"]
    assert [r[METHOD_COLUMN] for r in table] == ["LORAC", "MoCo-M"]
    for key, row in zip(("lorac", "mocom"), table, strict=True):
        saved = json.loads((tmp_path / key / "results.json").read_text())
        assert row[WEIGHTS_COLUMN] == saved["weights_sha256"] and len(row[WEIGHTS_COLUMN]) == 8
        assert row["Top-1"] == f"{100 * saved['results']['top1']:.2f}"
    assert table[0][WEIGHTS_COLUMN] != table[1][WEIGHTS_COLUMN]
    assert (tables / "table1_linear.md").read_text().count("| lorac_run |") == 1


def test_the_same_model_probed_twice_updates_its_one_row(models, tmp_path):
    """Proves a rerun of the same weights (another output dir) updates its own row: one row,
    the second run's cells."""
    tables = tmp_path / "tables"
    for epoch in ("1", "2"):
        argv = probe_argv(
            models["lorac"], models["data"], tmp_path / f"run{epoch}", tables,
            "--meta", f"train. epoch={epoch}",
        )  # fmt: skip
        linear_probe.main(argv)
    (row,) = rows(tables / "table1_linear.csv")
    assert row["Method"] == "lorac_run" and row["train. epoch"] == "2"


def test_a_clash_is_one_error_line_and_nothing_written(models, tmp_path):
    """Proves: a different model whose row name (its run directory's) is already in the table is
    refused before any work: exit 2, one error line naming the row and both hashes and saying how
    to resolve it, the table and the output dir untouched."""
    tables = tmp_path / "tables"
    linear_probe.main(probe_argv(models["lorac"], models["data"], tmp_path / "first", tables))
    out = tmp_path / "second"
    before = snapshot(tables, out)
    result = run_tool(
        ["tools/linear_probe.py", *probe_argv(models["namesake"], models["data"], out, tables)]
    )
    assert_user_error(result, before, tables, out, match="row 'lorac_run' holds another model's")
    assert "--name" in result.stderr and "--replace-row" in result.stderr


def test_a_clash_resolved_by_name_or_replace_row(models, tmp_path):
    """Proves --name gives the namesake its own row and --replace-row replaces the row of that
    name wholly (no cell of the other model kept)."""
    tables = tmp_path / "tables"
    first = probe_argv(models["lorac"], models["data"], tmp_path / "a", tables)
    linear_probe.main([*first, "--meta", "note=first"])
    other = probe_argv(models["namesake"], models["data"], tmp_path / "b", tables)
    linear_probe.main([*other, "--name", "lorac_run (seed 2)"])
    assert [r["Method"] for r in rows(tables / "table1_linear.csv")] == [
        "lorac_run",
        "lorac_run (seed 2)",
    ]
    linear_probe.main(probe_argv(models["namesake"], models["data"], tmp_path / "c", tables) + [
        "--replace-row"
    ])  # fmt: skip
    table = rows(tables / "table1_linear.csv")
    replaced = table[0]
    assert replaced["Method"] == "lorac_run" and replaced["note"] == ""
    assert replaced[WEIGHTS_COLUMN] == table[1][WEIGHTS_COLUMN]  # both rows: the namesake now


def test_a_table_written_before_rows_were_keyed(models, tmp_path, capsys):
    """Proves an old table (no method or hash columns) still takes new rows, its rows kept with
    the new columns empty, and a row of the same name there is refused (it may be another
    model's), in one error line, unless --replace-row."""
    tables = tmp_path / "tables"
    tables.mkdir()
    old = "Method,arch.,pars. (M),batchsize,epochs,Top-1,Top-5\n"
    (tables / "table1_linear.csv").write_text(old + "model_final,resnet50,23.5,256,100,90.48,99\n")
    linear_probe.main(probe_argv(models["lorac"], models["data"], tmp_path / "a", tables))
    table = rows(tables / "table1_linear.csv")
    assert [r["Method"] for r in table] == ["model_final", "lorac_run"]
    assert table[0]["Top-1"] == "90.48" and table[0][WEIGHTS_COLUMN] == ""
    assert (
        "| model_final | resnet50 | 23.5 | 256 | 100 | 90.48 | 99 | - | - |"
        in (tables / "table1_linear.md").read_text()
    )

    (tables / "table1_linear.csv").write_text(old + "lorac_run,resnet50,23.5,256,100,90.48,99\n")
    before = snapshot(tables)
    with pytest.raises(SystemExit) as stop:
        linear_probe.main(probe_argv(models["lorac"], models["data"], tmp_path / "b", tables))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("error:") == 1
    assert f"was written without a {WEIGHTS_COLUMN}" in err and snapshot(tables) == before
    assert not (tmp_path / "b").exists()
    linear_probe.main(
        probe_argv(models["lorac"], models["data"], tmp_path / "c", tables, "--replace-row")
    )
    (row,) = rows(tables / "table1_linear.csv")
    assert row["Method"] == "lorac_run" and row[WEIGHTS_COLUMN]


def test_semi_supervised_rows_are_keyed_by_model(models, tmp_path):
    """Proves Table 3: two models leave two rows; the same model's 1 % run fills its 10 % row;
    a namesake is refused before any work."""
    split = tmp_path / "split.txt"
    split.write_text("n01440764_0.JPEG\nn01443537_1.JPEG\nn01484850_2.JPEG\n")
    tables = tmp_path / "tables"

    def semi(key: str, out: str, percent: str) -> None:
        semi_supervised.main([
            "--config-file", os.path.join(QUICK, "semi_instant.yaml"),
            "--checkpoint", models[key], "--data-root", models["data"],
            "--split-file", str(split), "--output-dir", str(tmp_path / out),
            "--table-dir", str(tables), "DATA.LABEL_PERCENT", percent, "SOLVER.LRS", "(0.5,)",
        ])  # fmt: skip

    semi("lorac", "a10", "10")
    semi("mocom", "b10", "10")
    semi("lorac", "a1", "1")
    table = rows(tables / "table3_semi.csv")
    assert [(r["Model"], r[METHOD_COLUMN]) for r in table] == [
        ("lorac_run", "LORAC"),
        ("mocom_run", "MoCo-M"),
    ]
    assert table[0]["1% Top-1"] and table[0]["10% Top-1"] and not table[1]["1% Top-1"]
    with pytest.raises(SystemExit):
        semi("namesake", "c10", "10")
    assert rows(tables / "table3_semi.csv") == table and not (tmp_path / "c10").exists()


def test_knn_rows_are_keyed_by_model(models, tmp_path):
    """Proves knn.csv: two models leave two rows named after their runs; a namesake is refused
    before its output dir is made, and --name gives it its own row."""
    fm = make_knn_fashion_mnist(str(tmp_path / "fm"))
    tables = tmp_path / "tables"

    def knn(key: str, out: str, *extra: str) -> None:
        knn_eval.main([
            "--checkpoint", models[key], "--dataset", "fashion-mnist", "--data-root", fm,
            "--image-size", "32", "--k", "5", "--num-workers", "0", "--device", "cpu",
            "--output-dir", str(tmp_path / out), "--table-dir", str(tables), *extra,
        ])  # fmt: skip

    knn("lorac", "a")
    knn("mocom", "b")
    with pytest.raises(SystemExit):
        knn("namesake", "c")
    assert not (tmp_path / "c").exists()
    knn("namesake", "d", "--name", "seed 2")
    table = rows(tables / "knn.csv")
    assert [r["Model"] for r in table] == ["lorac_run", "mocom_run", "seed 2"]
    assert len({r[WEIGHTS_COLUMN] for r in table}) == 3


def test_transfer_tables_are_keyed_by_model(tmp_path):
    """Proves Table 2 and its details: a namesake with other weights is refused by
    check_tables and write_tables (nothing written), the same weights merge into one row, and
    replace swaps the row and its details wholly."""
    from transfer.classification.transfer import DatasetResult

    def result(key: str, name: str, score: float) -> DatasetResult:
        return DatasetResult(
            key, name, "top1", "val", "cached_features", 3, 10, 5, 5, 1, 1, [0.1], [score], 0.1,
            score,
        )  # fmt: skip

    tables = tmp_path / "tables"
    a, namesake = RowOwner("run", "LORAC", "aaaa0000"), RowOwner("run", "MoCo-M", "bbbb1111")
    write_tables(str(tables), a, [result("dtd", "DTD", 0.5)])
    write_tables(str(tables), a, [result("cifar10", "CIFAR10", 0.7)])
    (row,) = rows(tables / "table2_transfer.csv")
    assert (row["DTD"], row["CIFAR10"], row["n_datasets"]) == ("50.00", "70.00", "2")
    before = snapshot(tables)
    with pytest.raises(RowClashError, match="row 'run' holds another model's"):
        check_tables(str(tables), namesake, "cached_features")
    with pytest.raises(RowClashError):
        write_tables(str(tables), namesake, [result("dtd", "DTD", 0.1)])
    assert snapshot(tables) == before
    check_tables(str(tables), namesake, "augmented")  # another row: "run (augmented)"
    write_tables(str(tables), namesake, [result("dtd", "DTD", 0.1)], replace=True)
    (row,) = rows(tables / "table2_transfer.csv")
    assert (row["DTD"], row["CIFAR10"], row[WEIGHTS_COLUMN]) == ("10.00", "", "bbbb1111")
    details = rows(tables / "transfer_details.csv")
    assert {(d["run"], d[WEIGHTS_COLUMN]) for d in details} == {
        ("run/dtd", "bbbb1111"),
        ("run/cifar10", "aaaa0000"),
    }


def test_transfer_tool_refuses_a_namesake_before_any_work(models, tmp_path, no_md5):  # noqa: F811
    """Proves tools/transfer_linear.py names its row after the run, and refuses a namesake with
    other weights before its output dir is made."""
    data = tmp_path / "data"
    make_dtd(str(data / "dtd"))
    tables = tmp_path / "tables"

    def transfer(key: str, out: str) -> None:
        transfer_linear.main([
            "--config-file", os.path.join(QUICK, "transfer_instant.yaml"),
            "--checkpoint", models[key], "--data-root", str(data), "--datasets", "dtd",
            "--output-dir", str(tmp_path / out), "--table-dir", str(tables), "--device", "cpu",
            "--cache-dir", str(tmp_path / "cache"),
        ])  # fmt: skip

    transfer("lorac", "a")
    with pytest.raises(SystemExit):
        transfer("namesake", "b")
    assert not (tmp_path / "b").exists()
    (row,) = rows(tables / "table2_transfer.csv")
    assert (row["Model"], row[METHOD_COLUMN], len(row[WEIGHTS_COLUMN])) == ("lorac_run", "LORAC", 8)
