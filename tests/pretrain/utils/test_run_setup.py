"""Run setup (pretrain/utils/run_setup.py): every run dumps its config and environment, once."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fvcore.common.config import CfgNode

from pretrain.engine.launch import argument_parser, setup
from pretrain.engine.trainer import PretrainTrainer
from pretrain.utils.run_setup import dump_run_info
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG

# Every write of a file named config.yaml/env.txt in this process while recording: open() for
# writing or os.replace onto it (an atomic write), whoever the writer (ours or detectron2's).
_RUN_FILES = ("config.yaml", "env.txt")
_recorded: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _recorded is None:
        return
    if event == "open" and isinstance(args[0], str) and args[2] & (os.O_WRONLY | os.O_RDWR):
        path = args[0]
    elif event == "os.rename" and isinstance(args[1], str):
        path = args[1]
    else:
        return
    if os.path.basename(path) in _RUN_FILES:
        _recorded.append(os.path.basename(path))


sys.addaudithook(_audit)  # audit hooks cannot be removed; it is idle unless _recorded is a list


@pytest.fixture
def run_file_writes():
    global _recorded
    _recorded = []
    try:
        yield _recorded
    finally:
        _recorded = None


def test_pretraining_run_writes_config_and_env_exactly_once(
    image_folder, tmp_path, run_file_writes
):
    """tools/train_pretrain.py's setup plus the trainer: one config.yaml and one env.txt write
    (detectron2's default_setup wrote config.yaml a second time before)."""
    out = tmp_path / "run"
    args = argument_parser("test").parse_args(
        ["--config-file", DEMO_CONFIG, *tiny_opts(image_folder, out)]
    )
    cfg = setup(args)
    PretrainTrainer(cfg)
    assert sorted(run_file_writes) == ["config.yaml", "env.txt"]
    assert (out / "config.yaml").read_text() == cfg.dump()
    assert "Rank of current process: 0. World size: 1" in (out / "log.txt").read_text()


def test_dump_run_info_writes_atomically_with_open_modes(tmp_path):
    cfg = CfgNode({"OUTPUT_DIR": str(tmp_path), "SOLVER": CfgNode({"BASE_LR": 0.5})})
    old = os.umask(0o027)
    try:
        dump_run_info(str(tmp_path / "d"), cfg, args={"k": 200})
    finally:
        os.umask(old)
    d = tmp_path / "d"
    assert sorted(p.name for p in d.iterdir()) == ["args.json", "config.yaml", "env.txt"]
    assert {oct(p.stat().st_mode & 0o777) for p in d.iterdir()} == {oct(0o640)}
    assert (d / "config.yaml").read_text() == cfg.dump()
    assert json.loads((d / "args.json").read_text())["k"] == 200
    assert "PyTorch" in (d / "env.txt").read_text()
    dump_run_info(str(tmp_path / "e"))  # environment only
    assert [p.name for p in Path(tmp_path / "e").iterdir()] == ["env.txt"]
