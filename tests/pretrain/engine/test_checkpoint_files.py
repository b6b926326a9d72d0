"""A checkpoint that cannot be read is one error line naming it and how to go on: found before a
resumed run writes anything (what ``last_checkpoint`` names: missing, or truncated as a full disk
leaves it), and at load time for damage only a full read shows; SOLVER.MAX_TO_KEEP holds over
resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from detectron2.engine import HookBase

from pretrain.config.defaults import load_config
from pretrain.engine.checkpoint import (
    AtomicCheckpointer,
    check_last_checkpoint,
    periodic_checkpoints,
)
from pretrain.engine.run import run_pretraining
from pretrain.utils.errors import CheckpointError
from pretrain.utils.torch_files import incomplete_torch_file
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def _save(path, cut: bool = False) -> None:
    torch.save({"model": {"w": torch.arange(4096.0)}, "iteration": 1}, path)
    if cut:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def test_a_truncated_last_checkpoint_is_named_with_the_earlier_ones(tmp_path):
    _save(tmp_path / "model_0000001.pth")
    _save(tmp_path / "model_0000003.pth", cut=True)
    (tmp_path / "last_checkpoint").write_text("model_0000003.pth")
    with pytest.raises(CheckpointError) as e:
        check_last_checkpoint(str(tmp_path))
    msg = str(e.value)
    assert f"{tmp_path}/model_0000003.pth, the checkpoint {tmp_path}/last_checkpoint names" in msg
    assert "is truncated" in msg and "(there: model_0000001.pth)" in msg
    (tmp_path / "last_checkpoint").write_text("model_0000001.pth")  # what the message advises
    check_last_checkpoint(str(tmp_path))
    check_last_checkpoint(str(tmp_path / "no_run_here"))


def test_a_missing_last_checkpoint_is_named(tmp_path):
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    with pytest.raises(CheckpointError, match=r"model_final\.pth, .* is missing: to resume"):
        check_last_checkpoint(str(tmp_path))


def test_only_a_cut_off_zip_is_incomplete(tmp_path):
    _save(tmp_path / "whole.pth")
    _save(tmp_path / "cut.pth", cut=True)
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "legacy.pth").write_bytes(b"\x80\x02garbage")  # not torch's zip: the loader's
    assert incomplete_torch_file(str(tmp_path / "whole.pth")) is None
    assert incomplete_torch_file(str(tmp_path / "cut.pth")).startswith("truncated (")
    assert incomplete_torch_file(str(tmp_path / "empty.pth")) == "empty (0 bytes)"
    assert incomplete_torch_file(str(tmp_path / "legacy.pth")) is None


def test_a_file_torch_cannot_load_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "model_0000002.pth"
    path.write_bytes(b"\x80\x02garbage")
    checkpointer = AtomicCheckpointer(torch.nn.Linear(1, 1), str(tmp_path))
    with pytest.raises(CheckpointError, match=r"model_0000002\.pth: not a readable checkpoint"):
        checkpointer.load(str(path))


class _Crash(HookBase):
    def before_step(self) -> None:
        if self.trainer.iter == 2:
            raise RuntimeError("simulated crash")


def test_a_resumed_run_keeps_at_most_max_to_keep_periodic_checkpoints(tmp_path, image_folder):
    """Checkpoints every iteration, MAX_TO_KEEP 2, 4 iterations: the first process stops before
    iteration 2 (leaving model_0 and model_1), the resumed one saves 2 and 3. fvcore alone would
    leave model_0, 1, 2 and 3 (it counts only the files its own process wrote)."""
    out = tmp_path / "run"
    keys = {"SOLVER.CHECKPOINT_PERIOD": 1, "SOLVER.MAX_TO_KEEP": 2, "SOLVER.MAX_ITER": 4}
    opts = tiny_opts(image_folder, out, **keys)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pretraining(load_config(DEMO_CONFIG, opts), [_Crash()])
    assert sorted(p.name for p in out.glob("model_*.pth")) == [
        "model_0000000.pth",
        "model_0000001.pth",
    ]
    run_pretraining(load_config(DEMO_CONFIG, opts))  # resumes from model_0000001
    assert sorted(p.name for p in out.glob("model_*.pth")) == [
        "model_0000002.pth",
        "model_0000003.pth",
        "model_final.pth",
    ]


def test_periodic_checkpoints_are_listed_by_iteration_without_a_kept_final(tmp_path):
    names = (
        "model_0000010.pth",
        "model_0000002.pth",
        "model_final.pth",
        "x.pth",
        "model_0000005.pth",
    )
    for name in names:
        (tmp_path / name).write_bytes(b"")
    # an extended finished run keeps its final checkpoint as model_0000005.pth
    (tmp_path / "config_changes.json").write_text('[{"previous_final": "model_0000005.pth"}]')
    assert [Path(p).name for p in periodic_checkpoints(str(tmp_path))] == [
        "model_0000002.pth",
        "model_0000010.pth",
    ]
