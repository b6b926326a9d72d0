"""A checkpoint tensor that does not fit the model is an error on resume, never fvcore's "Skip
loading parameter ... incompatible shapes" warning: pretraining's AtomicCheckpointer refuses a queue
of another size swapped in by hand."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from pretrain.engine.checkpoint import AtomicCheckpointer
from pretrain.utils.errors import CheckpointError


class _WithQueue(nn.Module):
    def __init__(self, queue: int) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.register_buffer("queue", torch.zeros(2, queue))


def test_a_tensor_of_another_shape_is_an_error_naming_file_and_tensor(tmp_path, caplog):
    AtomicCheckpointer(_WithQueue(64), str(tmp_path)).save("model_final", iteration=5)
    model = _WithQueue(32)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as e:
        AtomicCheckpointer(model, str(tmp_path)).resume_or_load("", resume=True)
    assert "model_final.pth" in str(e.value)
    assert "queue (2, 64) vs model (2, 32)" in str(e.value)
    assert "Skip loading" not in caplog.text  # an error, not a warning


def test_a_fitting_checkpoint_still_loads(tmp_path):
    saved = _WithQueue(32)
    nn.init.ones_(saved.head.weight)
    AtomicCheckpointer(saved, str(tmp_path)).save("model_final", iteration=5)
    model = _WithQueue(32)
    extra = AtomicCheckpointer(model, str(tmp_path)).resume_or_load("", resume=True)
    assert extra["iteration"] == 5 and torch.equal(model.head.weight, saved.head.weight)
