"""Helpers shared by the checkpoint tests: seeded ResNets with non-trivial BatchNorm statistics
and the public checkpoint layouts of docs/checkpoints.md as tiny synthetic files (``CASES``).
Used by ``tests/transfer/checkpoint/``, ``tests/transfer/detection/`` and
``tests/transfer/export/``."""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


def randomise_bn(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-trivial BN affine parameters and running statistics, so a mis-mapped BN shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                m.num_batches_tracked.fill_(123)
    return model.eval()


def bb(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}


def pre(prefix: str, sd: dict) -> dict:
    return {prefix + k: v for k, v in sd.items()}


def d2_names(sd: dict, prefix: str = "") -> dict:
    """detectron2 names as ``convert-torchvision-to-d2.py`` writes them, re-done by string
    replacement (independent of transfer.checkpoint.resnet_names), numpy values, its ``stem.fc.*``
    kept."""
    out = {}
    for k, v in sd.items():
        n = k if "layer" in k else "stem." + k
        for t in (1, 2, 3, 4):
            n = n.replace(f"layer{t}", f"res{t + 1}")
        for t in (1, 2, 3):
            n = n.replace(f"bn{t}", f"conv{t}.norm")
        n = n.replace("downsample.0", "shortcut").replace("downsample.1", "shortcut.norm")
        out[prefix + n] = v.numpy()
    return out


def sequential(model) -> dict:
    """sthalles/PyTorch-BYOL's encoder: ``nn.Sequential(*list(resnet.children())[:-1])``."""
    return torch.nn.Sequential(*list(model.children())[:-1]).state_dict()


# layout -> (file suffix, builder(net, other) -> object to save)
Builder = Callable[[torch.nn.Module, torch.nn.Module], dict]
CASES: dict[str, tuple[str, str, Builder]] = {
    "lorac": (
        "lorac",
        ".pth",
        lambda n, o: {
            "model": pre("encoder_q.backbone.", bb(n))
            | pre("encoder_k.backbone.", bb(o))
            | {"encoder_q.head.0.weight": torch.randn(8, 512), "queues": torch.randn(2, 8, 16)},
            "iteration": 3,
        },
    ),
    "moco": (
        "moco",
        ".pth.tar",
        lambda n, o: {
            "state_dict": pre("module.encoder_q.", n.state_dict())
            | pre("module.encoder_k.", o.state_dict())
            | {"module.queue": torch.randn(8, 16), "module.queue_ptr": torch.zeros(1)},
            "epoch": 200,
            "arch": "resnet18",
        },
    ),
    "torchvision": ("torchvision", ".pth", lambda n, o: n.state_dict()),
    "barlowtwins-no-fc": ("torchvision", ".pth", lambda n, o: bb(n)),
    "swav": (
        "swav",
        ".pth.tar",
        lambda n, o: pre(
            "module.",
            bb(n)
            | {"projection_head.0.weight": torch.randn(16, 512)}
            | {"prototypes.weight": torch.randn(30, 16)},
        ),
    ),
    "dino-ddp": (
        "dino",
        ".pth",
        lambda n, o: {
            "teacher": pre("module.backbone.", bb(n))
            | {"module.head.mlp.0.weight": torch.randn(16, 512)},
            "student": pre("module.backbone.", bb(o))
            | {"module.head.mlp.0.weight": torch.randn(16, 512)},
            "epoch": 5,
            "args": argparse.Namespace(arch="resnet50", out_dim=60000),  # as main_dino.py saves
            "dino_loss": {"center": torch.zeros(1, 16)},
        },
    ),
    "dino-plain": (
        "dino",
        ".pth",
        lambda n, o: {"teacher": pre("backbone.", bb(n)), "student": pre("backbone.", bb(o))},
    ),
    "solo-learn": (
        "solo-learn",
        ".ckpt",
        lambda n, o: {
            "state_dict": pre("backbone.", bb(n))
            | pre("momentum_backbone.", bb(o))
            | {
                "projector.0.weight": torch.randn(16, 512),
                "classifier.weight": torch.randn(3, 512),
            },
            "epoch": 399,
            "global_step": 1000,
            "pytorch-lightning_version": "1.9.0",
        },
    ),
    "solo-learn-old": (
        "solo-learn",
        ".ckpt",
        lambda n, o: {"state_dict": pre("encoder.", bb(n)) | {"projector.0.weight": torch.ones(2)}},
    ),
    "vissl": (
        "vissl",
        ".torch",
        lambda n, o: {
            "type": "consolidated",
            "classy_state_dict": {
                "base_model": {
                    "model": {
                        "trunk": pre("_feature_blocks.", bb(n)),
                        "heads": {"0.clf.0.weight": torch.randn(16, 512)},
                    }
                },
                "train_phase_idx": 999,
            },
        },
    ),
    "simclr-state_dict": (
        "simclr-converted",
        ".pth",
        lambda n, o: {"state_dict": n.state_dict()},
    ),
    "simclr-resnet": (
        "simclr-converted",
        ".pth",
        lambda n, o: {"resnet": n.state_dict(), "head": {"0.weight": torch.randn(16, 512)}},
    ),
    "byol-sthalles": (
        "byol",
        ".pth",
        lambda n, o: {
            "online_network_state_dict": pre("encoder.", sequential(n))
            | {"projetion.net.0.weight": torch.randn(16, 512)},
            "target_network_state_dict": pre("encoder.", sequential(o)),
            "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        },
    ),
    "byol-online-encoder": (
        "byol-torchvision",
        ".pth",
        lambda n, o: pre("online_network.encoder.", bb(n)) | pre("target_network.encoder.", bb(o)),
    ),
    "byol-backbone": (
        "byol-torchvision",
        ".pth",
        lambda n, o: pre("backbone.", bb(n)) | {"neck.mlp.0.weight": torch.randn(4, 4)},
    ),
    "d2-torchvision-script": (
        "detectron2",
        ".pkl",
        lambda n, o: {
            "model": d2_names(n.state_dict()),
            "__author__": "torchvision",
            "matching_heuristics": True,
        },
    ),
    "d2-fpn-pkl": (
        "detectron2",
        ".pkl",
        lambda n, o: {
            "model": d2_names(bb(n), "backbone.bottom_up.")
            | {"backbone.fpn_lateral2.weight": np.zeros((4, 64, 1, 1), np.float32)},
            "__author__": "lorac",
            "matching_heuristics": False,
        },
    ),
}


def write(path: Path, obj: dict) -> None:
    if path.suffix == ".pkl":
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    else:
        torch.save(obj, path)
