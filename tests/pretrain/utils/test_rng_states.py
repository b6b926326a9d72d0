"""RngStates restores torch's, Python's and NumPy's global generators exactly, NumPy's position
inside its state block included (restored at position 624, the next draw would start a block)."""

from __future__ import annotations

import random

import numpy as np
import torch

from pretrain.utils.rng_states import RngStates


def _draws() -> tuple:
    return (torch.rand(3), random.random(), np.random.rand(3), np.random.randn())


def test_restored_generators_draw_what_they_would_have_drawn():
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    _draws()  # NumPy mid-block, a cached Gaussian pending
    saved = RngStates().state_dict()
    expected = _draws()
    _draws()
    RngStates().load_state_dict(saved)
    got = _draws()
    assert torch.equal(expected[0], got[0]) and expected[1] == got[1]
    assert np.array_equal(expected[2], got[2]) and expected[3] == got[3]


def test_saved_states_load_without_pickled_code(tmp_path):
    torch.save(RngStates().state_dict(), tmp_path / "rng.pth")
    RngStates().load_state_dict(torch.load(tmp_path / "rng.pth", weights_only=True))
