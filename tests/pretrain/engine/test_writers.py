"""One list of writers for every training tool (pretrain/engine/writers.py): the console
printer, metrics.json and TensorBoard always, W&B / MLflow on request; pretraining's
``--log-to mlflow`` records the same scalars as its TensorBoard events."""

from __future__ import annotations

import json

import pytest
from detectron2.utils.events import JSONWriter, TensorboardXWriter
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pretrain.engine.hooks import MetricPrinter
from pretrain.engine.writers import MlflowWriter, build_writers
from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.mistakes import run_main, tool_main
from transfer.classification.demo import DEMO_CONFIG


def test_every_tool_gets_the_printer_json_and_tensorboard(tmp_path):
    kinds = [type(w) for w in build_writers(str(tmp_path), 10)]
    assert kinds == [MetricPrinter, JSONWriter, TensorboardXWriter]
    assert [type(w) for w in build_writers(str(tmp_path), console=False)] == kinds[1:]


@pytest.mark.protocols  # a pretraining run
def test_pretraining_logs_to_tensorboard_and_mlflow(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    opts = tiny_opts(data, out, **{"SOLVER.MAX_ITER": 3, "SOLVER.LOG_PERIOD": 1})
    r = run_main(tool_main("tools/train_pretrain.py"),
                 ["--config-file", DEMO_CONFIG, "--log-to", "mlflow", *opts])  # fmt: skip
    assert r.returncode == 0, r.output[-3000:]
    events = EventAccumulator(str(out))
    events.Reload()
    tb = {e.step: e.value for e in events.Scalars("lr")}
    assert sorted(tb) == [0, 1, 2] and "total_loss" in events.Tags()["scalars"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{out / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("lorac").experiment_id])
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "lr")}
    assert logged == pytest.approx(tb)
    assert json.loads(run.data.params["SOLVER.MAX_ITER"]) == 3
    writers = build_writers(str(tmp_path), 3, ["mlflow", "mlflow"])
    assert [type(w) for w in writers][3:] == [MlflowWriter]  # once, however often named
    for w in writers:
        w.close()
