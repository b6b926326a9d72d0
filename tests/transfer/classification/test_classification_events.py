"""Every classification tool writes TensorBoard events with the documented scalar names
(docs/evaluation.md, "Logging"), read back with TensorBoard's own reader; ``--log-to wandb,mlflow``
also writes a W&B offline run and an MLflow file-store run, read back from their files; a
writer whose package is missing is one ``error:`` line naming the pip package. (Starting W&B's
service takes seconds: that test, with the semi-supervised and transfer ones, is in make
test-protocols.)"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.classification import (  # noqa: F401
    IMAGENET_CLASSES,
    QUICK,
    make_dtd,
    make_imagenet,
    make_knn_fashion_mnist,
    single_thread,
)
from tests.helpers.mistakes import run_main
from transfer.cli import knn_eval, linear_probe, semi_supervised, transfer_linear

TRAINING = {"total_loss", "lr"}  # every training step of every tool


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    split = root / "1percent.txt"
    split.write_text("".join(f"{c}_{i}.JPEG\n" for c in IMAGENET_CLASSES for i in range(2)))
    make_dtd(str(root / "transfer" / "dtd"))
    return {
        "imagenet": Path(make_imagenet(str(root / "imagenet"))),
        "split": split,
        "transfer": root / "transfer",
        "fashion": Path(make_knn_fashion_mnist(str(root / "fashion"), 20, 10)),
    }


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the TensorBoard event files in ``directory`` (not below): tag -> steps."""
    assert list(directory.glob("events.out.tfevents.*")), f"no event file in {directory}"
    events = EventAccumulator(str(directory))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def _ok(result) -> None:
    assert result.returncode == 0, result.output[-3000:]


def test_linear_probe_writes_loss_lr_and_accuracy_events(data, tmp_path):
    out = tmp_path / "probe"
    _ok(run_main(linear_probe.main, [
        "--config-file", f"{QUICK}/linear_instant.yaml", "--random-init", "resnet18",
        "--data-root", str(data["imagenet"]), "--output-dir", str(out), "--device", "cpu",
    ]))  # fmt: skip
    tb = scalars(out)
    assert TRAINING | {"eval/top1", "eval/top5"} <= tb.keys()
    assert [step for step, _ in tb["lr"]] == [0, 1, 2]
    top1 = json.loads((out / "results.json").read_text())["results"]["top1"]
    assert tb["eval/top1"] == [(3, pytest.approx(top1))]  # after the last step (2)


@pytest.mark.protocols  # over 3 s
def test_semi_supervised_writes_events_per_lr_and_for_the_selected_lr(data, tmp_path):
    out = tmp_path / "semi"
    _ok(run_main(semi_supervised.main, [
        "--config-file", f"{QUICK}/semi_instant.yaml", "--random-init", "resnet18",
        "--data-root", str(data["imagenet"]), "--split-file", str(data["split"]),
        "--output-dir", str(out), "--device", "cpu", "SOLVER.MAX_ITER", "1",
    ]))  # fmt: skip
    for lr in ("lr_0.1", "lr_1"):
        assert (
            TRAINING | {"eval/top1", "eval/top5", "eval/heldout_top1"} <= scalars(out / lr).keys()
        )
    results = json.loads((out / "semi_results.json").read_text())["results"]
    assert scalars(out)["eval/top1"] == [(0, pytest.approx(results["top1"]))]


def test_transfer_harness_writes_each_search_points_steps_and_each_datasets_scores(data, tmp_path):
    out = tmp_path / "transfer"
    _ok(run_main(transfer_linear.main, [
        "--config-file", f"{QUICK}/transfer_instant.yaml", "--random-init", "resnet18",
        "--data-root", str(data["transfer"]), "--datasets", "dtd", "--output-dir", str(out),
        "--device", "cpu", "TRANSFER.NUM_LRS", "2", "LOG_PERIOD", "2",
    ]))  # fmt: skip
    results = json.loads((out / "results.json").read_text())["results"]["dtd"]
    tb = scalars(out)
    assert tb["eval/dtd/test"] == [(0, pytest.approx(results["test_score"]))]
    assert tb["eval/dtd/val"] == [(0, pytest.approx(max(results["val_scores"])))]
    for search_point in ("train", "train+val"):  # the cached-features loop, every LOG_PERIOD
        steps = scalars(out / "cached_features" / "dtd" / search_point)
        assert steps.keys() >= TRAINING
        assert [step for step, _ in steps["lr"]] == [1, 3, 4]  # 5 iterations


def _knn(data: dict, out: Path, *extra: str) -> list[str]:
    return ["--random-init", "resnet18", "--dataset", "fashion-mnist", "--data-root",
            str(data["fashion"]), "--image-size", "16", "--output-dir", str(out),
            "--num-workers", "0", "--device", "cpu", *extra]  # fmt: skip


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of a W&B offline run's ``.wandb`` file. wandb 0.31 no longer ships a
    Python reader: the file is LevelDB's log format (32 KiB blocks of records with a 7-byte
    header, after a 7-byte file header) holding wandb's own ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    raw, pos, chunk, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:  # a block's zero-filled tail
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        chunk += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "history":
                items = record.history.item  # a key with "/" is stored split ("knn", "top1")
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
            chunk = b""
    return rows


@pytest.mark.protocols  # over 3 s
def test_knn_eval_writes_its_accuracy_to_tensorboard_wandb_and_mlflow(data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "knn"
    _ok(run_main(knn_eval.main, _knn(data, out, "--log-to", "wandb,mlflow")))
    top1 = json.loads((out / "results.json").read_text())["results"]["top1"]
    assert scalars(out)["knn/top1"] == [(0, pytest.approx(top1))]
    (row,) = _wandb_history(out)
    assert row["knn/top1"] == pytest.approx(top1) and row["_step"] == 0

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{out / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("lorac").experiment_id])
    history = client.get_metric_history(run.info.run_id, "knn/top1")
    assert [(m.step, m.value) for m in history] == [(0, pytest.approx(top1))]
    assert run.data.params["k"] == "200" and run.info.status == "FINISHED"
    assert math.isfinite(top1)
    # --overwrite replaces the run: its W&B and MLflow records go with it
    _ok(run_main(knn_eval.main, _knn(data, out, "--overwrite")))
    assert not (out / "wandb").exists() and not (out / "mlruns").exists()


def test_log_to_a_missing_package_is_one_error_line_naming_it(data, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    out = tmp_path / "knn"
    r = run_main(knn_eval.main, _knn(data, out, "--log-to", "mlflow"))
    assert r.returncode == 2, r.output[-3000:]
    (line,) = [ln for ln in r.output.splitlines() if ln.strip()]
    assert line.startswith("error:") and "pip install mlflow-skinny" in line, line
    assert not out.exists()
