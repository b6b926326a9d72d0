"""Which tool owns a run directory (pretrain/utils/run_owner.py): the recorded owner first, else
what the folder's files show, for runs made before owners were recorded; and every kind of
config the project ships is told apart by its keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from detectron2.config import get_cfg as detection_defaults

from pretrain.config.defaults import get_cfg
from pretrain.utils.errors import ConfigError
from pretrain.utils.run_owner import (
    OWNER_FILE,
    PRETRAINING,
    check_owner,
    config_kind,
    owner_of,
    record_owner,
)
from transfer.classification.config import (
    linear_probe_defaults,
    semi_supervised_defaults,
    transfer_defaults,
)

DEFAULTS = {
    PRETRAINING: get_cfg,
    "linear_probe": linear_probe_defaults,
    "semi_supervised": semi_supervised_defaults,
    "transfer_linear": transfer_defaults,
    "train_net": detection_defaults,
}


@pytest.mark.parametrize("kind", list(DEFAULTS))
def test_each_tools_config_and_legacy_run_is_told_by_its_keys(kind, tmp_path):
    cfg = DEFAULTS[kind]()
    assert config_kind(cfg) == kind
    (tmp_path / "config.yaml").write_text(cfg.dump())  # a run made before owners were recorded
    assert owner_of(str(tmp_path)) == kind


def test_a_child_config_is_told_by_its_bases_keys():
    child, base = {"SOLVER": {"EPOCHS": 2.0}}, {"LOSS": {"BETA": 2.0}}
    assert config_kind(child) is None
    assert config_kind(child, base) == PRETRAINING


@pytest.mark.parametrize(
    "files,kind",
    [
        ({"args.json": {"argv": ["tools/knn_eval.py", "--k", "5"]}}, "knn_eval"),
        ({"args.json": {"argv": ["/venv/bin/lorac-analyze-nuclear-norm"]}}, "analyze_nuclear_norm"),
        ({"semi_results.json": {}}, "semi_supervised"),
        ({".study.lock": ""}, "study"),
        ({"report.html": ""}, "make_report"),
        ({"args.json": {"argv": ["pytest"]}}, None),
        ({"notes.txt": "mine"}, None),
    ],
)
def test_legacy_runs_are_told_by_their_files(files, kind, tmp_path):
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / name).write_text(text)
    assert owner_of(str(tmp_path)) == kind


def test_the_recorded_owner_wins_and_is_recorded_once(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"LOSS": {"BETA": 4.0}}))
    record_owner(str(tmp_path), "linear_probe")
    assert json.loads((tmp_path / OWNER_FILE).read_text()) == {"owner": "linear_probe"}
    assert owner_of(str(tmp_path)) == "linear_probe"
    record_owner(str(tmp_path / "new"), "knn_eval")  # creates the folder
    assert owner_of(str(tmp_path / "new")) == "knn_eval"


def test_another_tools_run_is_refused_naming_owner_and_a_subfolder(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(get_cfg().dump())
    check_owner(str(run), PRETRAINING)  # its own kind: fine
    check_owner(str(tmp_path / "nowhere"), "knn_eval")  # nothing there: fine
    with pytest.raises(ConfigError) as e:
        check_owner(str(run), "knn_eval", "--output-dir")
    assert "holds a pretraining run (tools/train_pretrain.py; config.yaml)" in str(e.value)
    assert f"choose another --output-dir, e.g. {run}/knn_eval" in str(e.value)
