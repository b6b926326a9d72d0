"""The backbone every classification tool evaluates: a checkpoint in any layout of
``docs/checkpoints.md`` (:func:`transfer.checkpoint.reader.load_backbone`) or a random
initialisation. Its ``identity`` keys the feature cache, its ``weights`` hash the table rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torchvision
from torch import nn

from transfer.checkpoint.digest import weights_digest
from transfer.checkpoint.reader import build_torchvision_backbone, load_backbone

__all__ = ["ARCHS", "EvalBackbone", "file_sha256", "load_eval_backbone"]

# torchvision ResNets that transfer.checkpoint.reader understands, with their pooled feature width.
ARCHS = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048, "resnet152": 2048}


@dataclass
class EvalBackbone:
    """A ResNet up to global pooling (``fc = Identity``) and where its weights came from."""

    model: nn.Module
    arch: str
    feature_dim: int
    identity: str  # content hash of the checkpoint or the random-init recipe; keys the cache
    description: str  # for logs and tables
    weights: str = ""  # short hash of the weights evaluated; keys the model's table rows

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_eval_backbone(
    checkpoint: str | None = None, random_init: str | None = None, seed: int = 0
) -> EvalBackbone:
    """Exactly one of ``checkpoint`` (a file) or ``random_init`` (an arch name) must be given."""
    if (checkpoint is None) == (random_init is None):
        raise ValueError("give exactly one of a checkpoint path or --random-init ARCH")
    if random_init is not None:
        if random_init not in ARCHS:
            raise ValueError(
                f"--random-init: unknown arch {random_init!r}, choose from {list(ARCHS)}"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = torchvision.models.__dict__[random_init]()
        model.fc = nn.Identity()
        return EvalBackbone(
            model,
            random_init,
            ARCHS[random_init],
            f"random-init:{random_init}:seed{seed}",
            f"random-init {random_init} (seed {seed})",
            weights_digest(model.state_dict()),
        )
    weights = load_backbone(checkpoint)  # raises CheckpointError naming the file
    model = build_torchvision_backbone(weights)
    return EvalBackbone(
        model,
        weights.arch,
        ARCHS[weights.arch],
        f"sha256:{file_sha256(checkpoint)}",
        f"{checkpoint} ({weights.source_format} layout, {weights.arch})",
        weights_digest(model.state_dict()),
    )
