"""Pretraining meets the exact-resume contract every resumable tool is tested by
(tests/helpers/resume.py): ``tools/train_pretrain.py`` stopped by Ctrl-C after a step (its own
stop path: a checkpoint, exit 130) and run again ends with the uninterrupted run's model,
queues, optimizer and schedule, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import tiny_opts
from tests.helpers.mistakes import ToolResult, run_main, tool_main
from tests.helpers.resume import assert_resumes_exactly
from transfer.classification.demo import DEMO_CONFIG


@pytest.mark.protocols  # three short pretraining runs
@pytest.mark.parametrize("k", [0, 3], ids=["first", "mid-run"])
def test_pretraining_stopped_by_ctrl_c_resumes_bit_identical(k, image_folder, tmp_path,
                                                             monkeypatch):  # fmt: skip
    def run(out: Path, resume: bool) -> ToolResult:  # a pretraining run always resumes
        opts = tiny_opts(image_folder, out, **{"SOLVER.CHECKPOINT_PERIOD": 100})
        return run_main(tool_main("tools/train_pretrain.py"), ["--config-file", DEMO_CONFIG, *opts])

    assert_resumes_exactly(
        run, tmp_path / "full", tmp_path / "cut", k, monkeypatch, "", PretrainTrainer
    )
