"""Shared fixtures: tiny generated datasets (the helpers they use are in ``tests.helpers``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import make_image_folder

# One thread: the test models are tiny, and spare threads only spin on a shared CI machine.
torch.set_num_threads(1)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "data")
