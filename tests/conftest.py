"""Shared fixtures: tiny generated datasets (the helpers they use are in ``tests.helpers``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import make_image_folder

# the SLURM tests' `cluster` fixture (tests/slurm/fixtures.py), for every module that asks
pytest_plugins = ["tests.slurm.fixtures"]

# One thread: the test models are tiny, and spare threads only spin on a shared CI machine.
torch.set_num_threads(1)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "data")


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    """A torchvision ResNet-18 with random BatchNorm statistics (the checkpoint-layout fakes)."""
    import torchvision

    from tests.helpers.checkpoints import randomise_bn

    torch.manual_seed(0)
    return randomise_bn(torchvision.models.resnet18(), seed=1)


@pytest.fixture(scope="module")
def other() -> torch.nn.Module:
    """Different weights of the same shape (a student, a second candidate)."""
    import torchvision

    from tests.helpers.checkpoints import randomise_bn

    torch.manual_seed(5)
    return randomise_bn(torchvision.models.resnet18(), seed=6)
